"""Target ``unpadding``: the reference by hand, the oracle's checks, our glue, mutants."""

from __future__ import annotations

import dataclasses

import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import Implementation
from attnfuzz.harness.testing import hand_case
from attnfuzz.kernels import unpadding as kernels
from attnfuzz.reference import unpadding as ref

TARGET = "unpadding"


def judge(impl, case):
    t = get_target(TARGET)
    return t.judge(t.resolve(impl) if isinstance(impl, str) else impl, case)


def test_reference_pads_three_decodes_to_the_graph_of_8_and_unpads_them():
    case = hand_case((2, 2, 2), (1, 3, 5))
    inputs = ref.make_inputs(case)
    assert (inputs.num_reqs, inputs.num_tokens) == (3, 6)
    assert (inputs.num_reqs_padded, inputs.num_tokens_padded) == (4, 8)
    want = ref.reference(case, inputs)
    assert want.padded.query_start_loc.tolist() == [0, 2, 4, 6, 6]
    assert want.padded.seq_lens.tolist() == [3, 5, 7, 0]
    assert (want.padded.block_table[3] == 0).all()
    assert want.padded.slot_mapping[6:].tolist() == [-1, -1]
    assert want.unpadded.query_start_loc.tolist() == [0, 2, 4, 6]
    assert want.unpadded.block_table.shape[0] == 3 and len(want.unpadded.slot_mapping) == 6
    assert want.unpadded.max_query_len == want.padded.max_query_len == 2


def test_stale_buffers_hold_what_padding_must_overwrite():
    inputs = ref.make_inputs(hand_case((2, 2, 2), (1, 3, 5)))
    assert (inputs.slot_mapping_buffer[6:8] != -1).all()  # slots that look valid
    assert (inputs.seq_lens_buffer[3] != 0).item()
    assert (inputs.block_table_buffer[:3] == torch.as_tensor(inputs.block_table)).all()


def test_unpadded_step_is_padded_to_its_own_sizes():
    case = hand_case((1, 3), (4, 0))  # a prefill: no graph padding
    inputs = ref.make_inputs(case)
    assert (inputs.num_reqs_padded, inputs.num_tokens_padded) == (2, 4)
    assert judge("triton", case).ok


def test_views_are_required_of_the_padded_and_unpadded_fields():
    case = hand_case((2, 2, 2), (1, 3, 5))

    def padded_copy(inputs):
        out = kernels.pad_and_unpad(inputs)
        out.padded = dataclasses.replace(out.padded, seq_lens=out.padded.seq_lens.clone())
        return out

    checks = [m.check for m in judge(Implementation("h", padded_copy, "user"), case).mismatches]
    assert "view" in checks


def test_integers_must_be_python_ints():
    case = hand_case((2, 2, 2), (1, 3, 5))

    def tensor_count(inputs):
        out = kernels.pad_and_unpad(inputs)
        out.unpadded = dataclasses.replace(out.unpadded, num_reqs=torch.tensor(3))
        return out

    verdict = judge(Implementation("h", tensor_count, "user"), case)
    assert [m.where for m in verdict.mismatches] == ["unpadded.num_reqs"]
