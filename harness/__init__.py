"""attnfuzz.harness."""
