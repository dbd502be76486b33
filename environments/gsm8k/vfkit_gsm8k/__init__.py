"""gsm8k: grade-school math word problems (single turn), scored with MathRubric.

Data: `datasets.load_dataset("openai/gsm8k", "main")` (train / test splits). When the Hugging Face
hub cannot be reached, a small sample shipped with this package is used instead and a warning
says so: 60 problems written for vfkit in the style of GSM8K (not taken from it), 40 train and
20 test. `source="hub"` makes an unreachable hub an error; `source="sample"` skips the hub.

Reward: `correct_answer_reward_func` (MathRubric, math-verify) on the final answer: the last
`\\boxed{}` of the reply, else its last number.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

import vfkit as vf
from vfkit.bridge import v1_exports
from vfkit.errors import VfkitError
from vfkit.parsers.utils import extract_boxed_answer

logger = logging.getLogger(__name__)

HUB_ID, HUB_CONFIG = "openai/gsm8k", "main"
SAMPLE_PATH = Path(__file__).with_name("sample.jsonl")
SYSTEM_PROMPT = (
    "Solve the math problem step by step. Put the final number in \\boxed{}, e.g. \\boxed{42}."
)
NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(solution: str) -> str:
    """The number after '####' in a GSM8K solution, without thousands separators."""
    return solution.rsplit("####", 1)[-1].strip().replace(",", "")


def extract_final_answer(text: str) -> str:
    """The last \\boxed{} content of a reply, else its last number ('' when it has none)."""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed
    numbers = NUMBER_RE.findall(text or "")
    return numbers[-1].replace(",", "") if numbers else ""


def _boxed(text: str) -> str | None:
    if not isinstance(text, str) or "\\boxed{" not in text:
        return None
    return extract_boxed_answer(text)


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so an offline machine falls back at once instead of retrying."""
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def load_hub(split: str) -> list[dict[str, Any]]:
    """The real GSM8K split through `datasets` (uses the local cache when offline mode is on)."""
    from datasets import load_dataset

    if not _offline() and not hub_reachable():
        raise ConnectionError("huggingface.co is not reachable")
    return list(load_dataset(HUB_ID, HUB_CONFIG, split=split))


def load_sample(split: str) -> list[dict[str, Any]]:
    """The shipped offline sample's rows of `split` ("train" or "test")."""
    with SAMPLE_PATH.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"question": r["question"], "answer": r["answer"]} for r in rows if r["split"] == split]


def load_splits(source: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """(train rows, test rows, where they came from: "hub" or "sample")."""
    if source not in ("auto", "hub", "sample"):
        raise VfkitError(f"gsm8k: source must be 'auto', 'hub' or 'sample', not {source!r}")
    if source != "sample":
        try:
            return load_hub("train"), load_hub("test"), "hub"
        except Exception as e:
            if source == "hub":
                raise VfkitError(
                    f"gsm8k: could not load {HUB_ID} from the Hugging Face hub ({e}); check the "
                    "network / HF_HUB_OFFLINE, or pass source='sample'") from e
            logger.warning("gsm8k: %s is unavailable (%s: %s); using the offline sample shipped "
                           "with the package (%s, 40 train + 20 test problems)", HUB_ID,
                           type(e).__name__, e, SAMPLE_PATH.name)
    return load_sample("train"), load_sample("test"), "sample"


def to_rows(rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    return [{"question": r["question"], "answer": final_answer(r["answer"]),
             "info": {"solution": r["answer"], "source": source}} for r in rows]


def load_environment(
    source: str = "auto",
    num_train_examples: int = -1,
    num_eval_examples: int = -1,
    max_tokens: int = 256,
    system_prompt: str = SYSTEM_PROMPT,
) -> vf.Environment:
    """Build the environment from GSM8K (or the offline sample); -1 keeps every row."""
    train, test, origin = load_splits(source)
    if num_train_examples >= 0:
        train = train[:num_train_examples]
    if num_eval_examples >= 0:
        test = test[:num_eval_examples]
    parser = vf.Parser(extract_fn=extract_final_answer)
    return vf.SingleTurnEnv(
        dataset=to_rows(train, origin), eval_dataset=to_rows(test, origin),
        system_prompt=system_prompt, parser=parser, rubric=vf.MathRubric(parser=parser),
        sampling_args={"max_tokens": max_tokens}, env_id="gsm8k",
    )


# verifiers v1 / prime-rl: `vf.load_taskset("vfkit-gsm8k")` (needs vfkit[verifiers])
__all__, __getattr__ = v1_exports("gsm8k", load_environment)
