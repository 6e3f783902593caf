"""attnfuzz: differential testing and fuzzing of attention metadata."""

__version__ = "0.1.0"
