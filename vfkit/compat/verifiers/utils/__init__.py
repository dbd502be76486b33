"""`verifiers.utils` of 0.1.x (only `data_utils` is provided)."""
