"""attnfuzz.kernels."""
