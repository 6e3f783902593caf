"""The EAGLE draft after SGLang's DeepSeek-V4 engine on a CUDA GPU's multi-step backend
(runner-step's ``sglang-deepseek-v4-draft``): the backends the factory makes, each draft
step's writes, and its graph's capture and replay."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import (
    arrive_past_the_window_then_decode,
    deepseek_v4_swa_slot,
    life,
    requires_sglang,
)
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.reference import runner_step as ref

pytestmark = requires_sglang


def _draft():
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4_draft

    return runner_step_deepseek_v4_draft


def test_the_factory_makes_a_step_backend_per_draft_step():
    """``create_deepseek_v4_multistep_backend`` (FlashMLA's) makes the CUDA
    ``DeepseekV4MultiStepBackend``, a ``DeepseekV4AttnBackend`` per draft step, each
    knowing its step (what slices its write locations)."""
    m = _draft()
    m.run.new_engine()
    arrive, _ = life(m.run, arrive_past_the_window_then_decode(num_spec=3))
    from sglang.srt.layers.attention import deepseek_v4_backend as v4

    engine = m.DRAFT.engine
    steps = engine.draft_backend.attn_backends
    assert type(engine.draft_backend) is v4.DeepseekV4MultiStepBackend
    assert [type(b) for b in steps] == [v4.DeepseekV4AttnBackend] * 3
    assert [b.speculative_step_id for b in steps] == [0, 1, 2]
    assert ref.violations(arrive) == []


def test_each_draft_step_writes_its_own_slot_eager_and_replayed():
    """The draft of three steps after the verify: each attending step writes its own
    token's SWA slot (``per_step_draft_out_cache_loc``'s row ``speculative_step_id``:
    positions ``seq_len + step``), alike eager and in the graph of four; the padding
    request writes the padding slot 0; the third step (no attention) is in no build."""
    _, verify = life(_draft().run, arrive_past_the_window_then_decode(num_spec=3))
    assert [b.how for b in verify.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(verify, "eager", "seq_lens") == [151, 4, 2]
    swa = deepseek_v4_swa_slot
    for how in ("eager", "replay"):
        for step in (0, 1):
            written = _values(verify, how, f"swa_out_cache_loc.{step}")[:3]
            assert written == [swa(1, 151 + step), swa(2, 4 + step), swa(3, 2 + step)], how
    assert _values(verify, "replay", "swa_out_cache_loc.1")[3] == 0
    assert next(verify.of("padded")).field("swa_out_cache_loc.0") is None
    assert next(verify.of("replay")).field("swa_out_cache_loc.2") is None


def test_no_draft_step_reads_its_own_key_a_defect_of_0_5_23():
    """SGLang 0.5.23's CUDA step backends build each draft step's window from the
    accepted prefix's lengths (``seq_lens_casual.s`` the draft's ``seq_lens`` at every
    step; HIP's backend adds ``speculative_step_id + 1``): step ``s`` writes the key of
    position ``seq_len + s`` and its window ends at ``seq_len - 1``. Every real row of
    every build of the step's requests fails reading its own key, and no other property
    fails; HIP's draft of the same trace holds it (its test)."""
    _, verify = life(_draft().run, arrive_past_the_window_then_decode(num_spec=3))
    for how in ("eager", "replay"):
        for step in (0, 1):
            assert _values(verify, how, f"seq_lens_casual.{step}")[:3] == [151, 4, 2], how
    found = {(v.prop, v.field, v.build) for v in ref.violations(verify)}
    assert found == {
        ("queries read their own keys", f"swa_out_cache_loc.{step}", how)
        for step in (0, 1)
        for how in ("eager", "replay", "fresh")
    }
