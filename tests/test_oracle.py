"""The oracle: each check fails when it should, and only then."""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.graph import allocations
from attnfuzz.harness.oracle import (
    Verdict,
    exception_mismatch,
    expect_close,
    expect_contiguous,
    expect_equal,
    expect_meta,
    expect_no_allocation,
    expect_strides,
    expect_topk_rows,
    expect_untouched_outside,
    expect_view_of,
)
from attnfuzz.harness.testing import hand_case
from attnfuzz.kernels._triton import device

DEV = device()  # implementations' outputs live where the kernels run; the oracle reads them back
INF = np.inf
# One row with a tie at the k-th value: 6 at index 1, then 0 at indices 0 and 2.
LOGITS = np.array([[0.0, 6.0, 0.0, -INF]], dtype=np.float32)
CTX = np.array([3])


def topk(row: list[int], k: int = 2):
    return expect_topk_rows(
        "buf", torch.tensor([row], dtype=torch.int32, device=DEV), LOGITS, CTX, k
    )


def test_topk_accepts_any_choice_among_ties_and_any_order():
    assert topk([1, 0]) == [] and topk([1, 2]) == [] and topk([2, 1]) == []


def test_topk_rejects_each_kind_of_wrong_row():
    assert topk([0, 2])[0].check == "topk.values"  # 0, 0 instead of 6, 0
    assert topk([1, 3])[0].check == "topk.visible"  # key 3 is past the causal end
    assert topk([1, -1])[0].check == "topk.fill"  # -1 although 3 keys are visible
    assert topk([1, 1])[0].check == "topk.unique"
    assert topk([1, 0, 2, 3], k=4)[0].check == "topk.fill"  # only 3 visible: one -1
    assert topk([1, 0, 2, -1], k=4) == []


def test_topk_mismatch_says_where_and_what():
    (m,) = topk([0, 2])
    assert m.where == "buf[0]" and "6.0" in m.expected and "indices [0, 2]" in m.got


def test_equal_reports_the_first_bad_element_and_the_count():
    expected = np.arange(12, dtype=np.int32).reshape(4, 3)
    got = torch.as_tensor(expected.copy(), device=DEV)
    assert expect_equal("b", got, expected) == []
    got[1, 2] = -7
    got[3, 0] = -7
    (m,) = expect_equal("b", got, expected, check="unchanged")
    assert m.check == "unchanged" and m.where == "b[1, 2]"
    assert m.expected == "5" and m.got.startswith("-7; Mismatched elements: 2 / 12 (16.7%); ")
    rows = np.array([True, False, True, False])  # rows 1 and 3 are not checked
    assert expect_equal("b", got, expected, rows) == []


# -- the one form of a value mismatch (torch.testing's, on one line) -----------------


def test_a_slice_is_reported_at_the_elements_index_in_the_named_tensor():
    """``buffer[4:][1]`` is ``buffer[5]``; ``out[1]``'s ``[0, 2]`` is ``out[1, 0, 2]``."""
    expected = np.full(8, -1, dtype=np.int64)
    got = torch.as_tensor(expected.copy(), device=DEV)
    got[5] = 7
    tail = np.s_[4:]
    (m,) = expect_equal("buffer", got[tail], expected[tail], check="padding", at=tail)
    assert (m.check, m.where, m.expected) == ("padding", "buffer[5]", "-1")
    assert m.got.startswith("7; ")
    table = np.zeros((2, 3, 4), dtype=np.int32)
    wrong = torch.as_tensor(table.copy(), device=DEV)
    wrong[1, 0, 2] = 3
    (m,) = expect_equal("pages", wrong[1], table[1], at=1, label="draft")
    assert m.where == "pages[1, 0, 2] (draft)" and "at index (1, 0, 2)" in m.got
    (m,) = expect_equal("lens", wrong[:, 0, 2], table[:, 0, 2], at=np.s_[:, 0, 2])
    assert m.where == "lens[1, 0, 2]"


def test_the_slot_mapping_target_names_the_padding_slot_itself():
    """The step of 6 tokens padded to 8: slot 9 of the buffer is the tail's second."""
    from attnfuzz.harness.targets import slot_mapping as target
    from attnfuzz.reference import slot_mapping as ref

    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = ref.make_inputs(case)
    assert inputs.num_tokens_padded == 8
    got = target.reference_impl(inputs)
    got.buffer[9] = 12
    (m,) = target.compare(case, inputs, ref.reference(case, inputs), got)
    assert (m.check, m.where, m.expected) == ("padding", "slot_mapping_buffer[9]", "-1")
    assert Verdict([m]).key == "padding"  # the finding's key: its check, as before


def test_the_count_line_counts_the_wrong_elements_of_those_compared():
    expected = np.arange(16, dtype=np.int32).reshape(4, 4)
    got = torch.as_tensor(expected.copy(), device=DEV)
    got[0, 3], got[2, 1], got[3, 3] = 0, 99, 3
    (m,) = expect_equal("block_table", got, expected)
    assert m.where == "block_table[0, 3]" and (m.expected, m.got.split(";")[0]) == ("3", "0")
    assert "; Mismatched elements: 3 / 16 (18.8%); " in m.got
    rows = np.array([False, True, True, False])  # 8 elements compared, 1 wrong
    (m,) = expect_equal("block_table", got, expected, rows)
    assert m.where == "block_table[2, 1]" and "; Mismatched elements: 1 / 8 (12.5%); " in m.got


def test_the_greatest_difference_line_of_integers_is_exact():
    expected = np.arange(16, dtype=np.int64).reshape(4, 4)
    got = torch.as_tensor(expected.copy(), device=DEV)
    got[0, 3], got[2, 1], got[3, 3] = 0, 99, -(2**62)  # a difference past 2**53
    (m,) = expect_equal("block_table", got, expected)
    assert str(m) == (
        "[values] block_table[0, 3]: expected 3, got 0; Mismatched elements: 3 / 16 (18.8%); "
        f"Greatest absolute difference: {2**62 + 15} at index (3, 3) (up to 0 allowed)"
    )


def test_the_greatest_difference_lines_of_floats_give_the_tolerances_used():
    expected = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    got = torch.as_tensor(expected.copy(), device=DEV)
    got[1, 0] = 3.5
    got[1, 1] = 4.5
    (m,) = expect_close("out", got, expected, rows=np.array([False, True]), at=0)
    assert m.where == "out[0, 1, 0]" and (m.expected, m.got.split(";")[0]) == ("3.0", "3.5")
    assert m.got.split("; ")[1:] == [
        "Mismatched elements: 2 / 2 (100.0%)",
        "Greatest absolute difference: 0.5 at index (0, 1, 0) (up to 1e-05 allowed)",
        "Greatest relative difference: 0.16666667 at index (0, 1, 0) (up to 1.3e-06 allowed)",
    ]
    got[1, 1] = float("nan")  # NaN is the greatest difference, as assert_close says
    (m,) = expect_close("out", got[1:], expected[1:], at=np.s_[1:])
    assert "Greatest absolute difference: nan at index (1, 1)" in m.got
    (m,) = expect_close("out", got.to(torch.bfloat16), expected)  # bfloat16's tolerances
    assert "(up to 1e-05 allowed)" in m.got and "(up to 0.016 allowed)" in m.got


def test_untouched_memory_is_reported_at_its_index_in_the_buffer():
    buffer = torch.zeros(3, 4, dtype=torch.int32, device=DEV)
    before = buffer.cpu().numpy().copy()
    view = buffer[:1]
    view.fill_(5)  # its own: free
    buffer[2, 1] = 9
    (m,) = expect_untouched_outside("persistent", buffer, before, view)
    assert (m.check, m.where, m.expected) == ("unchanged", "persistent[2, 1]", "0")
    assert "; Mismatched elements: 1 / 8 (12.5%); " in m.got


def test_close_uses_assert_close_tolerances_and_never_passes_nan():
    e = np.array([1.0, 2.0], dtype=np.float32)

    def t(*values: float) -> torch.Tensor:  # an implementation's output, on DEV
        return torch.tensor(values, device=DEV)

    assert expect_close("x", t(1.0, 2.0 + 1e-7), e) == []
    assert expect_close("x", t(1.0, 2.001), e)[0].check == "values"
    assert expect_close("x", t(1.0, float("nan")), e)[0].check == "values"
    nan = np.array([1.0, np.nan], dtype=np.float32)
    assert expect_close("x", t(1.0, float("nan")), nan)[0].check == "values"
    assert expect_close("x", t(1.0, -INF), np.array([1.0, -INF])) == []


def test_meta_checks_type_shape_and_dtype_exactly():
    assert expect_meta("x", [1], (1,), torch.int32)[0].check == "type"
    t = torch.zeros(2, 3, dtype=torch.int64, device=DEV)
    checks = [m.check for m in expect_meta("x", t, (3, 2), torch.int32)]
    assert checks == ["shape", "dtype"]
    assert expect_meta("x", t, (2, 3), torch.int64) == []


def test_strides_contiguity_and_views():
    buffer = torch.zeros(4, 8, dtype=torch.int32, device=DEV)
    strided = buffer[:2, :3]
    assert expect_strides("v", strided, (8, 1)) == []
    assert expect_strides("v", strided, (3, 1))[0].check == "stride"
    assert expect_contiguous("v", strided)[0].check == "contiguous"
    assert expect_contiguous("v", buffer.view(-1)[:6].view(2, 3)) == []
    assert expect_view_of("v", buffer.view(-1)[:6], buffer) == []
    assert expect_view_of("v", buffer.view(-1)[2:6], buffer)[0].got == "element 2"
    assert expect_view_of("v", strided.contiguous(), buffer)[0].got == "new storage"


def test_allocation_recorder_sees_copies_and_factories_not_views():
    buffer = torch.zeros(4, 8, dtype=torch.int32, device=DEV)
    _, allocated = allocations(lambda b: b[:2, :3], buffer)
    assert allocated == []
    _, allocated = allocations(lambda b: b[:2, :3].contiguous(), buffer)
    assert len(allocated) == 1 and "[2, 3]" in allocated[0]
    _, allocated = allocations(lambda b: torch.empty(5, device=b.device), buffer)
    assert len(allocated) == 1
    _, allocated = allocations(
        lambda b: b.view(-1)[:6].copy_(torch.arange(6, device=b.device)), buffer
    )
    assert len(allocated) == 1  # the arange, not the in-place copy
    assert expect_no_allocation("f", allocated)[0].check == "graph"


def test_allocation_recorder_sees_values_read_back_to_the_host():
    buffer = torch.arange(6, device=device())
    _, allocated = allocations(lambda b: b[:2].add_(int(b[3])), buffer)
    assert len(allocated) == 1 and "_local_scalar_dense" in allocated[0]
    _, allocated = allocations(lambda b: b[:2].add_(b[3]), buffer)  # stays on the device
    assert allocated == []


def test_exception_becomes_a_finding_with_type_and_message():
    m = exception_mismatch("impl", RuntimeError("Target sizes: [8, 4].\n Tensor sizes: [6, 4]"))
    assert (
        m.check == "exception"
        and m.got == "RuntimeError: Target sizes: [8, 4]. Tensor sizes: [6, 4]"
    )
    assert Verdict([m]).key == "exception:RuntimeError"
    assert Verdict([]).ok and str(Verdict([])) == "PASS"


def test_check_names_are_the_strings_case_files_hold():
    """``Check`` members are their strings: written as before, read back equal."""
    import json

    from attnfuzz.harness.oracle import Check, Mismatch

    (m,) = expect_meta("x", torch.zeros(2), (3,), torch.float32)
    assert m.check is Check.SHAPE and m.check == "shape"
    written = json.dumps(m.to_dict())
    assert json.loads(written)["check"] == "shape" and '"check": "shape"' in written
    assert Mismatch(**json.loads(written)) == m  # a case file's mismatch compares equal
    assert Check("topk.fill") is Check.TOPK_FILL
    assert len({c.value for c in Check}) == len(Check)
