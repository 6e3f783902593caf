"""attnfuzz.strategies."""
