"""Target ``max-seq-len``: the bound that sizes paged kernels (bug D, #43991).

Which check catches what, honestly: a ``max_seq_len`` from the model limit (or
from the wrong rows, e.g. the decodes only) is caught by its exact value against the reference
(``max_seq_len``: tight outside capture) and by the consumer's walk (``walk``:
more block-table entries read than the tight bound walks) and, where the extra
entries hold garbage, by the bounds count (``page_bounds``). The consumer's
values (``values``) do *not* change: it masks keys by position, so stale and
poisoned pages are never loaded. That is the upstream bug: wasted work and
reads of stale page ids, and nothing raised.
"""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.oracle import Mismatch, expect_close, expect_equal, expect_meta
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import max_seq_len as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig


def _as_int(name: str, value: object) -> tuple[int | None, list[Mismatch]]:
    """A host integer or a 0-d integer tensor, as a host integer."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
        return int(value.item()), []
    if isinstance(value, int) and not isinstance(value, bool):
        return value, []
    what = f"tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else value
    return None, [Mismatch("type", name, "an int or a 0-d integer tensor", str(what))]


def expect_bounded(name: str, value: int, lower: int, max_model_len: int) -> list[Mismatch]:
    """The invariant of every valid bound: ``max(seq_len[:R]) <= max_seq_len <= max_model_len``."""
    if lower <= value <= max_model_len:
        return []
    return [
        Mismatch(
            "invariant",
            name,
            f"max(seq_lens[:R])={lower} <= {name} <= max_model_len={max_model_len}",
            str(value),
        )
    ]


def expect_tight(
    name: str, value: int, expected: int, inputs: ref.MaxSeqLenInputs, upper_max: int
) -> list[Mismatch]:
    """Exactly the fixed rule: tight outside capture, ``max_model_len`` at capture."""
    if value == expected:
        return []
    R, M = inputs.num_real_reqs, inputs.max_model_len
    if inputs.capturing:
        why = "max_model_len at graph capture"
    elif name.startswith("draft"):
        why = f"min(max(seq_lens_cpu_upper_bound[:{R}])={upper_max} + {inputs.num_spec_steps}, {M})"
    else:
        why = f"max(seq_lens_cpu_upper_bound[:{R}]), tight outside capture"
    return [Mismatch("max_seq_len", name, f"{expected} ({why})", str(value))]


def compare(
    case: Case,
    inputs: ref.MaxSeqLenInputs,
    expected: ref.MaxSeqLenExpected,
    got: ref.MaxSeqLenOutputs,
) -> list[Mismatch]:
    R, D = inputs.num_reqs, inputs.kv_cache.shape[2]
    out: list[Mismatch] = []
    for name, want, have in (
        ("max_seq_len", expected.max_seq_len, got.max_seq_len),
        ("draft_max_seq_len", expected.draft_max_seq_len, got.draft_max_seq_len),
    ):
        if want is None or have is None:  # the draft path exists with speculative decoding
            if want is not have:
                no_draft = f"num_spec={inputs.num_spec_steps}"
                out.append(Mismatch("max_seq_len", name, f"{want} ({no_draft})", str(have)))
            continue
        value, bad = _as_int(name, have)
        if bad:
            out += bad
            continue
        out += expect_bounded(name, value, expected.lower, inputs.max_model_len)
        out += expect_tight(name, value, want, inputs, expected.upper_max)

    fields = ("pages_walked", "pages_needed", "oob_pages")
    meta = expect_meta("out", got.out, (2, R, D), torch.float32)
    for field in fields:
        meta += expect_meta(field, getattr(got, field), (2, R), torch.int32)
    if meta:
        return out + meta
    for path, label in enumerate(ref.PATHS):
        # The walk: entries read per request, and the ones that held a visible position.
        # Each named tensor's first dimension is the path: ``label`` says which.
        for field in fields[:2]:
            out += expect_equal(
                field, getattr(got, field)[path], getattr(expected, field)[path],
                check="walk", at=path, label=label,
            )  # fmt: skip
        out += expect_equal(
            "oob_pages", got.oob_pages[path], expected.oob_pages[path],
            check="page_bounds", at=path, label=label,
        )  # fmt: skip
        out += expect_close("out", got.out[path], expected.out[path], at=path, label=label)
    return out


def walk_statistic(got: ref.MaxSeqLenOutputs) -> dict[str, int]:
    """Pages walked vs pages needed over both paths of one step (1:1 is no over-walk)."""
    return {
        "pages_walked": int(got.pages_walked.sum()),
        "pages_needed": int(got.pages_needed.sum()),
    }


def reference_impl(inputs: ref.MaxSeqLenInputs) -> ref.MaxSeqLenOutputs:
    """The reference run as an implementation (a self-check of the harness)."""
    e = ref.reference(None, inputs)
    device = inputs.kv_cache.device

    def dev(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(x).to(device)

    return ref.MaxSeqLenOutputs(
        e.max_seq_len, e.draft_max_seq_len, dev(e.out),
        dev(e.pages_walked), dev(e.pages_needed), dev(e.oob_pages),
    )  # fmt: skip


# ---------------------------------------------------------------------------
# Where each mutant lives (reach) and when it changes a bound (trigger)
# ---------------------------------------------------------------------------


def _bounds(case: Case) -> tuple[np.ndarray, int]:
    """``seq_lens_cpu_upper_bound`` and the real request count of ``case``."""
    return ref.upper_bounds(case), ref.describe(case).num_real_reqs


def _capturing(case: Case) -> bool:
    return bool(case.param("capturing"))


def reach_model_len(case: Case) -> bool:
    """Outside capture the model state's bound comes from the batch."""
    return not _capturing(case)


def trigger_model_len(case: Case) -> bool:
    """The batch's bound is below the model limit: ``max(upper[:R]) < max_model_len``."""
    upper, R = _bounds(case)
    return reach_model_len(case) and int(upper[:R].max()) < case.config.max_model_len


def reach_draft_model_len(case: Case) -> bool:
    """The drafter's decode steps (``num_spec >= 2``) outside capture."""
    return ref.has_draft(case.config.num_spec) and not _capturing(case)


def trigger_draft_model_len(case: Case) -> bool:
    """``max(upper[:R]) + num_spec < max_model_len``: the draft's bound is below the limit."""
    upper, R = _bounds(case)
    top = int(upper[:R].max())
    return reach_draft_model_len(case) and top + case.config.num_spec < case.config.max_model_len


# ---------------------------------------------------------------------------
# The smallest triggers, derived by hand
# ---------------------------------------------------------------------------


def _smallest(next_n: int, capture_size: int, max_num_seqs: int, seed: int = 0) -> Case:
    """One request of ``next_n`` tokens, nothing computed, on the strategies' smallest engine."""
    config = EngineConfig(
        max_model_len=8,  # the strategies' least
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=capture_size,
        block_size=1,
        num_spec=next_n - 1,
        cudagraph_capture_sizes=(capture_size,),
        topk=1,
        num_heads=1,
        head_dim=1,
    )
    return Case(config, Batch((0,), (next_n,), seed, True), (("capturing", 0),))


def smallest_model_len() -> Case:
    """next_n = 1, one token, seq_len 1: the tight bound is 1 against max_model_len 8."""
    return _smallest(next_n=1, capture_size=1, max_num_seqs=1)


def smallest_draft_model_len() -> Case:
    """next_n = 3 (the drafter's decode steps need two speculative tokens), one request
    of 3 tokens: its bound is 3 to 5, the draft's ``min(5 + 2, 8) <= 7 < 8``."""
    return _smallest(next_n=3, capture_size=3, max_num_seqs=1)


def build() -> Target:
    from attnfuzz.kernels import max_seq_len as k

    target = Target(
        runs_in="runner",
        name="max-seq-len",
        summary="max_seq_len of the model state and the draft, and a paged kernel walking by it",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        params={"capturing": (0, 1)},
        statistics=walk_statistic,
        # Pages needed grow as sequences near the table's edge (max_model_len),
        # where stale and out-of-cache page ids sit; pages_walked is not guided
        # (an over-walk is already a mismatch, never a step towards one).
        guided=("pages_needed",),
        # The KV cache and the consumer's output are float32 by construction.
        dtypes=(torch.float32,),
    )
    target.add(Implementation("triton", k.max_seq_len_metadata, "fixed", "tight bounds (fixed)"))
    target.add(Implementation("reference", reference_impl, "reference", "the NumPy reference"))
    target.add(
        Implementation(
            "pr43991-model-len",
            k.mutant_model_len,
            "mutant",
            "#43991: the model state's max_seq_len is max_model_len outside capture",
            trigger=trigger_model_len,
            reach=reach_model_len,
            smallest=smallest_model_len,
        )
    )
    target.add(
        Implementation(
            "pr43991-draft-model-len",
            k.mutant_draft_model_len,
            "mutant",
            "#43991: the draft model's max_seq_len is max_model_len",
            trigger=trigger_draft_model_len,
            reach=reach_draft_model_len,
            smallest=smallest_draft_model_len,
        )
    )
    return target
