"""SGLang's decode graph runner filling its input buffers: a hand case, and #24743 reverted."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import requires_sglang
from attnfuzz.harness.targets import graph_input_padding as t
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import graph_input_padding as ref
from attnfuzz.reference.batch import Batch, Case

pytestmark = requires_sglang


def _three_padded_to_four(hybrid_swa: int = 1) -> Case:
    params = (("hybrid_swa", hybrid_swa), ("seq_len_fill_value", 1))
    return Case(spec_config(), Batch((5, 9, 0), (2, 2, 2), seed=3), params)


def _run(fn, case: Case):
    inputs = ref.make_inputs(case)
    stale = {name: buf.clone() for name, buf in inputs.buffers.items()}
    return inputs, stale, fn(inputs)


def test_three_requests_padded_to_four():
    from attnfuzz.adapters.sglang.graph_runner import run

    case = _three_padded_to_four()
    inputs, stale, got = _run(run, case)
    assert (got.batch_size, got.num_padding, got.seq_lens_sum) == (4, 1, 7 + 11 + 2 + 1)
    assert got.graph["seq_lens"].tolist() == [7, 11, 2, 1]
    assert got.graph["seq_lens_cpu"].tolist() == [7, 11, 2, 1]
    assert got.graph["seq_lens_cpu"].device.type == "cpu"
    assert got.graph["req_pool_indices"].tolist() == inputs.step["req_pool_indices"].tolist() + [0]
    assert got.graph["positions"].tolist() == [5, 6, 9, 10, 0, 1, 0, 0]
    for name in ("out_cache_loc", "out_cache_loc_swa"):
        assert got.graph[name].tolist() == inputs.step[name].tolist() + [0, 0], name
    # The padded request's token ids are left as the earlier step wrote them.
    assert got.graph["input_ids"][6:].tolist() == stale["input_ids"][6:8].tolist()
    assert t.compare(case, inputs, ref.reference(case, inputs), got) == []


def test_rows_past_the_graph_keep_the_earlier_step():
    from attnfuzz.adapters.sglang.graph_runner import run

    _, stale, got = _run(run, _three_padded_to_four())
    for name, buf in got.buffers.items():
        n = got.graph[name].shape[0]
        assert buf[n:].tolist() == stale[name][n:].tolist(), name


def test_pr24743_reverted_leaves_the_padded_swa_slots_stale():
    from attnfuzz.adapters.sglang.graph_runner import upstream_stale_swa_slots

    case = _three_padded_to_four()
    inputs, stale, got = _run(upstream_stale_swa_slots, case)
    assert got.graph["out_cache_loc_swa"][6:].tolist() == stale["out_cache_loc_swa"][6:8].tolist()
    assert got.graph["out_cache_loc"][6:].tolist() == [0, 0]  # the full pool's still zeroed
    bad = t.compare(case, inputs, ref.reference(case, inputs), got)
    assert [(m.check, m.where) for m in bad] == [("padding", "graph.out_cache_loc_swa[6]")]


def test_pr24743_reverted_agrees_without_a_sliding_window_pool():
    from attnfuzz.adapters.sglang.graph_runner import upstream_stale_swa_slots

    case = _three_padded_to_four(hybrid_swa=0)
    inputs, _, got = _run(upstream_stale_swa_slots, case)
    assert "out_cache_loc_swa" not in got.graph
    assert t.compare(case, inputs, ref.reference(case, inputs), got) == []
