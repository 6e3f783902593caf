"""The stand-in of hpc-ops' decode scheduler both engines' HPC backends call
(``attnfuzz.adapters.hpc_ops``): what it records and what it refuses."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch
from attnfuzz.adapters import hpc_ops
from attnfuzz.adapters.standins import VendorContractError
from attnfuzz.harness.blame import attnfuzz_fault


def test_the_task_map_records_each_schedule_and_refuses_what_overruns_it():
    """The stand-in's schedule of the decodes, and the calls hpc-ops' op refuses: each
    refusal the engine's misuse of hpc-ops' contract, a finding (harness/blame.py), never
    attnfuzz's fault."""
    task_map = hpc_ops.get_attention_decode_task_workspace(2, 128, 1)
    assert task_map[hpc_ops.BATCH] == -1  # no schedule yet
    lengths = torch.tensor([7, 0], dtype=torch.int32)
    hpc_ops.assign_attention_decode_task(lengths, task_map, 1, 2, True)
    record = hpc_ops.schedule(lengths, 2, True)
    assert task_map[hpc_ops.BATCH :].tolist() == record == [2, 2, 1, 7, 0]
    assert hpc_ops.stale_entries(task_map, lengths, 2) == 0
    # The map read beside other lengths, or another query count: stale entries counted.
    assert hpc_ops.stale_entries(task_map, torch.tensor([7, 3], dtype=torch.int32), 2) == 1
    assert hpc_ops.stale_entries(task_map, lengths, 1) == 1
    refusals = [
        (torch.tensor([7], dtype=torch.int64), 1, 1, "int32"),
        (torch.tensor([1, 2, 3], dtype=torch.int32), 1, 1, "3 requests"),
        (torch.tensor([129], dtype=torch.int32), 1, 1, "129 keys"),
        (torch.tensor([7], dtype=torch.int32), 2, 1, "2 KV heads"),
        (torch.tensor([7], dtype=torch.int32), 1, 0, "0 queries"),
        (torch.tensor([7], dtype=torch.int32), 1, 5, "5 queries"),
    ]
    for lengths, heads, queries, message in refusals:
        with pytest.raises(VendorContractError, match=message) as refused:
            hpc_ops.assign_attention_decode_task(lengths, task_map, heads, queries, True)
        assert attnfuzz_fault(refused.value, refused.tb) is None


def test_the_package_imports_only_inside_the_block_and_runs_no_kernel():
    """``hpc`` is found (SGLang asks ``importlib.util.find_spec``) inside the block only;
    its bf16 decode takes a task map (SGLang reads the signature) and refuses to run."""
    assert importlib.util.find_spec("hpc") is None
    with hpc_ops.hpc():
        import hpc

        assert importlib.util.find_spec("hpc") is not None
        assert "task_map" in inspect.signature(hpc.attention_decode_bf16).parameters
        with pytest.raises(RuntimeError, match="no forward"):
            hpc.attention_decode_bf16(*(None,) * 5)
    assert importlib.util.find_spec("hpc") is None
