"""Hand-built cases of ``graph-input-padding``: what a padded replay leaves in the buffers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnfuzz.harness.targets import graph_input_padding as t
from attnfuzz.harness.testing import spec_config
from attnfuzz.kernels import graph_input_padding as k
from attnfuzz.reference import graph_input_padding as ref
from attnfuzz.reference.batch import Batch, Case


def _case(hybrid_swa: int = 1, fill: int = 1, q_lens=(2, 2, 2), computed=(1, 1, 1)) -> Case:
    params = (("hybrid_swa", hybrid_swa), ("seq_len_fill_value", fill))
    return Case(spec_config(), Batch(computed, q_lens, seed=0), params)


def test_capture_batch_sizes_are_token_sizes_over_next_n():
    # spec_config: next_n = 2, capture sizes 2, 4, 8, ..., 128 tokens, 64 requests at most.
    assert ref.capture_batch_sizes(_case())[:4] == (1, 2, 4, 8)
    assert ref.capture_batch_sizes(_case())[-1] == 64
    assert ref.padded_batch_size(_case()) == 4


def test_three_requests_padded_to_four_by_hand():
    case = _case(fill=3, computed=(5, 9, 0))  # seq_lens 7, 11, 2
    inputs = ref.make_inputs(case)
    want = ref.reference(case, inputs)
    slots = inputs.step["out_cache_loc"].tolist()
    swa = inputs.step["out_cache_loc_swa"].tolist()
    rows = inputs.step["req_pool_indices"].tolist()
    assert want.graph["seq_lens"].tolist() == [7, 11, 2, 3]
    assert want.graph["seq_lens_cpu"].tolist() == [7, 11, 2, 3]
    assert want.graph["req_pool_indices"].tolist() == rows + [0]
    assert want.graph["positions"].tolist() == [5, 6, 9, 10, 0, 1, 0, 0]
    assert want.graph["out_cache_loc"].tolist() == slots + [0, 0]
    assert want.graph["out_cache_loc_swa"].tolist() == swa + [0, 0]
    assert len(want.graph["input_ids"]) == 6  # padded ids: not part of the contract
    assert (want.batch_size, want.num_padding, want.seq_lens_sum) == (4, 1, 7 + 11 + 2 + 3)


def test_stale_rows_are_never_a_padding_value():
    inputs = ref.make_inputs(_case(fill=2))
    for name, buf in inputs.buffers.items():
        pad = ref.pad_value(name, 2)
        if pad is not None:
            assert (buf != pad).all(), name


def test_no_swa_buffer_without_a_sliding_window_pool():
    inputs = ref.make_inputs(_case(hybrid_swa=0))
    assert "out_cache_loc_swa" not in inputs.step
    assert "out_cache_loc_swa" not in ref.reference(None, inputs).graph


def test_an_unpadded_step_writes_only_its_rows():
    case = _case(q_lens=(2, 2, 2, 2), computed=(0, 0, 0, 0))
    inputs = ref.make_inputs(case)
    stale = {name: buf.clone() for name, buf in inputs.buffers.items()}
    got = k.graph_input_padding(inputs)
    assert got.num_padding == 0
    for name, buf in got.buffers.items():
        n = got.graph[name].shape[0]
        assert torch.equal(buf[n:], stale[name][n:]), name
    assert t.compare(case, inputs, ref.reference(case, inputs), got) == []


@pytest.mark.parametrize(
    ("mutant", "field"),
    [(k.mutant_stale_swa_slots, "out_cache_loc_swa"), (k.mutant_stale_positions, "positions")],
)
def test_a_stale_field_fails_the_padding_check_on_its_padded_rows(mutant, field):
    case = _case()
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    stale = inputs.buffers[field][6:8].clone()
    bad = t.compare(case, inputs, expected, mutant(inputs))
    assert [(m.check, m.where) for m in bad] == [("padding", f"graph.{field}[6]")]  # first wrong
    assert np.array_equal(inputs.buffers[field][6:8].numpy(), stale.numpy())


def test_triggers():
    assert t.trigger_swa_padded(_case()) and not t.trigger_swa_padded(_case(hybrid_swa=0))
    unpadded = _case(q_lens=(2, 2), computed=(0, 0))
    assert not t.trigger_padded(unpadded) and not t.trigger_swa_padded(unpadded)
    for mutant, trigger in ((k.mutant_stale_swa_slots, t.trigger_swa_padded),):
        for case in (_case(), _case(hybrid_swa=0), unpadded):
            inputs = ref.make_inputs(case)
            bad = t.compare(case, inputs, ref.reference(case, inputs), mutant(inputs))
            assert bool(bad) == trigger(case)


def test_a_copy_instead_of_a_view_is_a_view_mismatch():
    case = _case()
    inputs = ref.make_inputs(case)
    got = k.graph_input_padding(inputs)
    got.graph["seq_lens"] = got.graph["seq_lens"].clone()
    bad = t.compare(case, inputs, ref.reference(case, inputs), got)
    assert [(m.check, m.where) for m in bad] == [("view", "graph.seq_lens")]
