"""vLLM 0.33.0's model runner V1 step as its CPU worker makes it (``CPUModelRunner``), on
the CPU attention backend, as the implementation ``vllm-v1-cpu`` of ``runner-step``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def cpu():
    from attnfuzz.adapters.vllm import runner_step_cpu

    return runner_step_cpu


def two_steps(num_spec: int) -> Trace:
    """Two requests prefill 33 and 5 tokens (the first across a page of 32), then each
    decodes ``1 + num_spec`` tokens."""
    config = EngineConfig(
        max_model_len=96, max_num_seqs=2, max_num_batched_tokens=64, block_size=32,
        num_spec=num_spec, cudagraph_capture_sizes=(1,), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    q = 1 + num_spec
    return Trace(
        config,
        (
            Batch((0, 0), (33, 5), req_ids=(7, 8), pages=((1, 2), (3,)), new_pages=(2, 1)),
            Batch((33, 5), (q, q), req_ids=(7, 8), pages=((1, 2), (3,)), new_pages=(0, 0)),
        ),
    )


@pytest.mark.parametrize("num_spec", [0, 1])
def test_the_cpu_worker_builds_every_step_on_the_cpu_backend(monkeypatch, num_spec):
    """The runner is the CPU worker's, its host and device buffers one tensor
    (``_postprocess_tensors``); ``CPUAttentionMetadataBuilder.build`` builds every step
    (the drafter's too) and asks the C++ scheduler of the step's lengths; every property
    holds, and the kernel reads each request's keys up to its length."""
    m = cpu()
    m.prepare()
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    builds = Calls(monkeypatch)
    builds.count(CPUAttentionMetadataBuilder, "build")
    asked = []
    schedule = m.scheduler_metadata

    def scheduler_metadata(num_reqs, *args, **kwargs):
        asked.append(num_reqs)
        return schedule(num_reqs, *args, **kwargs)

    monkeypatch.setattr(m, "scheduler_metadata", scheduler_metadata)
    engine = m.CPURunnerStepEngine()
    first, second = run_trace(two_steps(num_spec), engine)
    runner = engine.eager.runner
    assert type(runner) is CPUModelRunner
    table = runner.input_batch.block_table.block_tables[0].block_table
    assert runner.query_start_loc.gpu is runner.query_start_loc.cpu and table.gpu is table.cpu
    assert isinstance(runner.attn_groups[0][0].get_metadata_builder(), CPUAttentionMetadataBuilder)
    assert builds["build"] >= 3 * (1 + (num_spec > 0)) and 2 in asked
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    assert values(eager, "seq_lens") == [33 + 1 + num_spec, 5 + 1 + num_spec]
    assert values(eager, "kv_len") == values(eager, "seq_lens")
    if num_spec:
        assert [b.draft for b in second.of("eager") if b.draft is not None] == [0]


def test_the_engine_puts_back_what_the_cpu_runner_changes_for_the_process():
    """``CPUModelRunner.__init__`` makes ``torch.accelerator``'s synchronize and
    empty_cache no-ops for the process; the engine puts them back."""
    m = cpu()
    m.prepare()
    kept = torch.accelerator.synchronize, torch.accelerator.empty_cache
    run_trace(two_steps(0), m.CPURunnerStepEngine())
    assert (torch.accelerator.synchronize, torch.accelerator.empty_cache) == kept


def test_the_scheduler_stand_in_refuses_what_the_cpp_scheduler_checks():
    """``get_scheduler_metadata``'s ``TORCH_CHECK``\\ s (the counts, the ISA hint, the
    cache dtype) and what it reads (int32 lengths and offsets of the request count)."""
    from attnfuzz.harness.blame import attnfuzz_fault

    m = cpu()
    lens = torch.tensor([3, 5], dtype=torch.int32)
    offsets = torch.tensor([0, 1, 2], dtype=torch.int32)

    def ask(**changes):
        call = dict(num_reqs=2, num_heads=2, num_kv_heads=1, head_dim=64, seq_lens=lens,
                    dtype=torch.bfloat16, query_start_loc=offsets, causal=True,
                    sliding_window_size=-1, isa="vec", enable_kv_split=False)  # fmt: skip
        return m.scheduler_metadata(**(call | changes))

    assert ask().dtype == torch.uint8
    for changes, said in (
        ({"num_reqs": -1}, "nonnegative"),
        ({"num_kv_heads": 0}, "positive"),
        ({"isa": "avx2"}, "ISA hint"),
        ({"kv_cache_dtype": "int8"}, "kv_cache_dtype"),
        ({"seq_lens": lens.long()}, "seq_lens must be int32"),
        ({"query_start_loc": offsets[:2]}, "at least 3 entries"),
    ):
        with pytest.raises(m.VendorContractError, match=said) as refused:
            ask(**changes)
        # The engine's misuse of the C++ contract: a finding (harness/blame.py).
        assert attnfuzz_fault(refused.value, refused.tb) is None


def test_it_declines_pages_and_graphs_the_cpu_platform_has_not():
    m = cpu()
    config = two_steps(0).config
    assert m.declines_config(config) is None
    assert "multiples of 32" in m.declines_config(dataclasses.replace(config, block_size=16))
    graphs = dataclasses.replace(config, cudagraph_mode="FULL_AND_PIECEWISE")
    assert "captures none" in m.declines(Case(graphs, two_steps(0).steps[0]))
