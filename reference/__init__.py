"""attnfuzz.reference."""
