"""Hypothesis profiles of this suite; attnfuzz's plugin runs under the one loaded."""

import os

from hypothesis import settings

# Few examples: a quick suite. "nightly" searches longer, with the example
# database under .hypothesis/ (failures found there replay first next time).
settings.register_profile("quick", max_examples=25, deadline=None, database=None)
settings.register_profile("thorough", max_examples=300, deadline=None, database=None)
settings.register_profile("nightly", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
