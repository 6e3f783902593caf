"""One module per target: inputs, reference, comparison and implementations."""
