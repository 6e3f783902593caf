"""Hypothesis profiles of this suite; attnfuzz's plugin runs under the one loaded."""

import os

from hypothesis import settings

# "quick": few examples, no example database. "thorough" and "nightly" search
# longer and keep Hypothesis' example database (under .hypothesis/): a failure
# found once replays first the next time. They derive from Hypothesis' own
# defaults, not from the profile loaded when this file runs: where the variable
# CI is set, Hypothesis loads its "ci" profile, which has no database.
defaults = settings.get_profile("default")
settings.register_profile("quick", defaults, max_examples=25, deadline=None, database=None)
settings.register_profile("thorough", defaults, max_examples=1000, deadline=None)
settings.register_profile("nightly", defaults, max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
