"""`verifiers.utils` of 0.1.x: `data_utils`, `async_utils` and `tool_utils` are provided."""
