"""The builder's context lengths, judged by attnfuzz's oracle of ``mtp-seq-lens``."""

from pathlib import Path

import attnfuzz
import mtp_builder
from hypothesis import example, given

TARGET = "mtp-seq-lens"
CASES = Path(__file__).parent / "cases"
FOUND = CASES / "mtp-seq-lens--mtp_builder_context_lens_noclamp--values.json"


# The implementation judged is the one under test of the target: the ini key
# attnfuzz_impl, or --attnfuzz-impl on the command line. A case file found once
# is an explicit example, tried first on every run.
@given(case=attnfuzz.cases(TARGET))
@example(case=attnfuzz.load_case(FOUND))
def test_context_lens_agree_with_the_oracle(case, attnfuzz_judge):
    attnfuzz_judge(TARGET, case)


# The public API without the plugin's fixture: judge a callable directly.
@given(case=attnfuzz.cases(TARGET))
def test_fixed_builder_through_the_public_api(case):
    verdict = attnfuzz.judge(TARGET, mtp_builder.context_lens, case)
    assert verdict.ok, str(verdict)
