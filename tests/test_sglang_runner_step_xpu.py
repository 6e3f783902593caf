"""SGLang's decode graph runner step on the Intel XPU attention backend (runner-step's
``sglang-xpu``): its own metadata code, FlashAttention 3's fields, and its mutant."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, scheduled
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace


def _arrive_then_decode(num_spec: int) -> Trace:
    """Three requests arrive (5, 3 and 1 tokens), then decode (or verify) together:
    three requests in the graph of four, on pages of 64 tokens (the least this backend
    runs), a page each."""
    config = spec_config(num_spec=num_spec, max_num_seqs=8, block_size=64,
                         cudagraph_capture_sizes=(2, 4, 8, 16))  # fmt: skip
    w, pages = config.next_n, ((1,), (2,), (3,))
    return Trace(
        config,
        (
            scheduled((0, 0, 0), (5, 3, 1), (0, 1, 2), pages, (1, 1, 1)),
            scheduled((5, 3, 1), (w, w, w), (0, 1, 2), pages, (0, 0, 0)),
        ),
    )


def _life(trace: Trace, name: str = "run"):
    from attnfuzz.adapters.sglang import runner_step_xpu

    return life(getattr(runner_step_xpu, name), trace)


@_sglang
def test_the_xpu_backend_builds_every_build(monkeypatch):
    """XPUAttentionBackend's own methods build the eager, capture and replay metadata
    (not FlashAttention 3's): a decode of three requests replays the graph of four, the
    padding request at the fill length 1 on the reserved row 0."""
    from attnfuzz.adapters.sglang import runner_step_xpu

    runner_step_xpu.prepare()
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend
    from sglang.srt.layers.attention.xpu_backend import XPUAttentionBackend

    calls = {"xpu": 0}
    real = XPUAttentionBackend.init_forward_metadata_out_graph

    def counted(self, *args, **kwargs):
        calls["xpu"] += 1
        return real(self, *args, **kwargs)

    def refused(*args, **kwargs):
        raise AssertionError("FlashAttention 3's backend ran")

    monkeypatch.setattr(XPUAttentionBackend, "init_forward_metadata_out_graph", counted)
    monkeypatch.setattr(FlashAttentionBackend, "init_forward_metadata", refused)
    first, second = _life(_arrive_then_decode(num_spec=0))
    assert calls["xpu"] > 0
    assert [b.how for b in second.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(second, "eager", "page_table") == [[1], [2], [3]]
    for how in ("padded", "replay"):
        assert _values(second, how, "cache_seqlens_int32") == [6, 4, 2, 1], how
        assert _values(second, how, "cu_seqlens_q") == [0, 1, 2, 3, 4], how
    assert ref.violations(first) == [] and ref.violations(second) == []


@_sglang
def test_a_verify_reads_its_drafts_in_the_graph_as_eagerly():
    _, verify = _life(_arrive_then_decode(num_spec=1))
    assert _values(verify, "eager", "cache_seqlens_int32") == [7, 5, 3]
    assert _values(verify, "replay", "cache_seqlens_int32")[:3] == [7, 5, 3]
    assert ref.violations(verify) == []


def test_the_xpu_backend_declines_the_pages_sglang_never_runs_it_with():
    """SGLang runs intel_xpu on pages of 64 or 128 tokens (any other becomes 128)."""
    from attnfuzz.adapters.sglang import runner_step_xpu
    from attnfuzz.reference.batch import Batch, Case

    def case(page: int) -> Case:
        return Case(spec_config(num_spec=0, block_size=page), Batch((0,), (1,), 0, True))

    for page in (1, 4, 16, 32):
        assert "_intel_xpu_page_constraint" in runner_step_xpu.declines(case(page))
    assert runner_step_xpu.declines(case(64)) is None
    assert runner_step_xpu.declines(case(128)) is None


@_sglang
def test_the_table_short_of_window_fails_safe_padding_and_the_fixed_backend_passes():
    """The graph's page table sized next_n short of the context: a decode to the
    model's limit reads past its row in the padded and replayed builds."""
    from attnfuzz.adapters.sglang import runner_step_xpu

    trace = runner_step_xpu.smallest_table_short_of_window()
    assert runner_step_xpu.trigger_table_short_of_window(trace)
    assert all(ref.violations(out) == [] for out in _life(trace))
    *_, out = _life(trace, "run_table_short_of_window")
    found = ref.violations(out)
    assert {(v.prop, v.build) for v in found} >= {("safe padding", "padded"),
                                                  ("safe padding", "replay")}  # fmt: skip


@_sglang
def test_the_fa3_engine_runs_after_the_xpu_backend_s_module_loaded():
    """The XPU module imports ``sgl_kernel.flash_attn`` at load, unguarded: attnfuzz's
    kernels' stand-in answers it and stays in ``sys.modules`` (any loader of the module
    does it: the compatibility check of the adapters' APIs too). The FA3 engine built
    after it must still find FlashAttention 3's scheduler by its contract, not that
    raising stand-in (the engine tier ran sglang-fa3 after it in one worker). In a
    process of its own, the XPU module loaded first; a decode the graph replays (FA3
    computes its scheduler metadata for it)."""
    import subprocess
    import sys

    script = (
        "import attnfuzz.kernels._triton\n"
        "from attnfuzz.adapters.sglang import runner_step_fa3\n"
        "from attnfuzz.adapters.sglang.testing import arrive_then_decode, life\n"
        "from attnfuzz.reference import runner_step as ref\n"
        "runner_step_fa3.prepare()\n"
        "import sglang.srt.layers.attention.xpu_backend\n"
        "outs = life(runner_step_fa3.run, arrive_then_decode(num_spec=0))\n"
        "assert all(ref.violations(out) == [] for out in outs)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
