"""Example datasets and answer extractors, under the names classic verifiers used.

    rows = load_example_dataset("gsm8k", split="train", n=100)   # question / answer columns
    extract_boxed_answer(r"... \\boxed{42}")                      # '42'

Every example dataset here lives on the Hugging Face hub: the real `datasets.load_dataset` call
is made, and when the hub cannot be reached the error says which dataset was needed and what to
do instead (vfkit ships no copies of third-party data).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from vfkit.errors import ConfigError
from vfkit.parsers.utils import extract_boxed_answer

__all__ = ["EXAMPLE_DATASETS", "extract_boxed_answer", "extract_hash_answer",
           "load_example_dataset"]


def extract_hash_answer(text: str) -> str:
    """The text after the last '####' (GSM8K's final-answer marker), or the text when absent.

    >>> extract_hash_answer("3 + 4 = 7\\n#### 7")
    '7'
    """
    if not isinstance(text, str):
        return ""
    return text.rsplit("####", 1)[-1].strip() if "####" in text else text.strip()


@dataclass(frozen=True)
class ExampleDataset:
    """Where an example dataset lives on the hub and how its rows become question / answer."""

    path: str
    config: str | None
    question: str
    answer: Callable[[dict[str, Any]], str]


def _column(name: str) -> Callable[[dict[str, Any]], str]:
    return lambda row: str(row[name])


EXAMPLE_DATASETS: dict[str, ExampleDataset] = {
    "gsm8k": ExampleDataset("openai/gsm8k", "main", "question",
                            lambda row: extract_hash_answer(row["answer"])),
    "math": ExampleDataset("chiayewken/competition_math", None, "problem",
                           lambda row: extract_boxed_answer(row["solution"])),
    "math500": ExampleDataset("HuggingFaceH4/MATH-500", None, "problem", _column("answer")),
    "aime2024": ExampleDataset("HuggingFaceH4/aime_2024", None, "problem", _column("answer")),
    "amc2023": ExampleDataset("knoveleng/AMC-23", None, "problem", _column("answer")),
}


def load_example_dataset(name: str = "gsm8k", split: str | None = None,
                         n: int | None = None, seed: int = 0) -> Dataset:
    """`name`'s rows as a Dataset with `question` and `answer` columns.

    With `n`, the rows are shuffled with `seed` and the first `n` kept.
    `split` defaults to "train" ("test" for datasets that have only a test split). Raises
    ConfigError for an unknown name, or when the hub cannot provide the dataset (offline).
    """
    spec = EXAMPLE_DATASETS.get(name)
    if spec is None:
        raise ConfigError(f"load_example_dataset: unknown dataset {name!r}; known: "
                          f"{sorted(EXAMPLE_DATASETS)}. Build your own rows with 'question' and "
                          "'answer' columns instead.")
    from datasets import load_dataset

    try:
        splits = load_dataset(spec.path, spec.config)
    except Exception as e:  # offline, no such repo, ...: one clear message, cause chained
        raise ConfigError(
            f"load_example_dataset({name!r}) needs the Hugging Face hub dataset {spec.path!r}, "
            f"which could not be loaded ({type(e).__name__}: {e}). Connect to the hub (unset "
            "HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) or pass your own dataset=[{'question': ..., "
            "'answer': ...}] to the environment."
        ) from e
    split = split or ("train" if "train" in splits else next(iter(splits)))
    if split not in splits:
        raise ConfigError(f"load_example_dataset({name!r}): no split {split!r}; "
                          f"available: {sorted(splits)}")
    rows = [{"question": str(r[spec.question]), "answer": spec.answer(r)} for r in splits[split]]
    dataset = Dataset.from_list(rows)
    if n is not None and n >= 0:
        dataset = dataset.shuffle(seed=seed).select(range(min(n, len(dataset))))
    return dataset
