"""`verifiers.utils.data_utils` of 0.1.x, served by `vfkit.utils.data_utils`."""

from vfkit.utils.data_utils import extract_boxed_answer, extract_hash_answer, load_example_dataset

# the system prompt classic math environments pair with extract_boxed_answer
BOXED_SYSTEM_PROMPT = "Think step by step, then give your final answer inside \\boxed{}."

__all__ = [
    "BOXED_SYSTEM_PROMPT", "extract_boxed_answer", "extract_hash_answer", "load_example_dataset",
]
