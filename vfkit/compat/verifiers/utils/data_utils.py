"""`verifiers.utils.data_utils` of 0.1.x, served by `vfkit.utils.data_utils`."""

from vfkit.utils.data_utils import extract_boxed_answer, extract_hash_answer, load_example_dataset

__all__ = ["extract_boxed_answer", "extract_hash_answer", "load_example_dataset"]
