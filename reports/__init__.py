"""attnfuzz.reports."""
