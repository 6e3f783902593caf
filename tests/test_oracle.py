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
    expect_view_of,
)
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


def test_equal_reports_the_first_bad_row_and_the_count():
    expected = np.arange(12, dtype=np.int32).reshape(4, 3)
    got = torch.as_tensor(expected.copy(), device=DEV)
    assert expect_equal("b", got, expected) == []
    got[1, 2] = -7
    got[3, 0] = -7
    (m,) = expect_equal("b", got, expected, check="unchanged")
    assert m.check == "unchanged" and m.where == "b[1] (and 1 more rows)"
    assert m.expected == "[3, 4, 5]" and m.got == "[3, 4, -7]"
    rows = np.array([True, False, True, False])  # rows 1 and 3 are not checked
    assert expect_equal("b", got, expected, rows) == []


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
