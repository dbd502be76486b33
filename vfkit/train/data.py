"""Which prompts each step trains on: a seeded order that a resumed run reproduces exactly.

The prompts of step s are a pure function of (seed, s): the dataset is reshuffled every epoch
with seed + epoch and read in order, so the "data cursor" is just the next step number. The
extra prompts of dynamic sampling are a pure function of (seed, s, round) too, drawn beside
that order so that it stays the same with or without them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vfkit.client.limits import SequenceLimits
from vfkit.images import map_image_urls, message_image_urls
from vfkit.train.vision import ImageInputs, is_image_processor, text_tokenizer
from vfkit.types import State


class DataOrder:
    """Dataset indices for each (1-based) step."""

    def __init__(self, num_examples: int, prompts_per_step: int, seed: int) -> None:
        if num_examples < 1:
            raise ValueError("the training dataset is empty")
        self.num_examples = num_examples
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            rng = np.random.default_rng(self.seed + epoch)
            self._perms[epoch] = rng.permutation(self.num_examples)
        return self._perms[epoch]

    def indices(self, step: int) -> list[int]:
        """The dataset rows of step `step` (continuing into the next epoch when needed)."""
        start = (step - 1) * self.prompts_per_step
        positions = range(start, start + self.prompts_per_step)
        return [int(self._perm(p // self.num_examples)[p % self.num_examples]) for p in positions]

    def refill(self, step: int, round_: int, count: int, taken: set[int]) -> list[int]:
        """`count` more rows for step `step` (dynamic sampling, round 1, 2, ...), none of
        `taken` (the rows the step sampled so far) while the dataset has others, distinct
        while it has enough."""
        rng = np.random.default_rng([self.seed, step, round_])
        others = [i for i in range(self.num_examples) if i not in taken] or sorted(taken)
        picked = rng.choice(len(others), size=count, replace=count > len(others))
        return [others[int(i)] for i in picked]


def prompt_length(tokenizer: Any, prompt: Any, media_dirs: Sequence[str] = ()) -> int:
    """Tokens of a prompt as the server will render it (chat template + generation prompt).

    `tokenizer` may be a VLM's processor: a prompt with images then counts each image's
    expanded placeholder tokens, as the server sends them to the model. `media_dirs`: folders
    its `file://` images may come from (the server's --allowed-local-media-path).
    """
    if isinstance(prompt, str):
        return len(text_tokenizer(tokenizer)(prompt)["input_ids"])
    if is_image_processor(tokenizer):  # the processor's own template, images expanded
        return ImageInputs(tokenizer, media_dirs).prompt_length(prompt)
    ids = tokenizer.apply_chat_template(
        prompt, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return len(ids)


def dataset_rows(
    dataset: Any, tokenizer: Any, max_prompt_len: int, media_dirs: Sequence[str] = ()
) -> tuple[list[dict], int]:
    """Rows as dicts with an example_id, minus prompts over max_prompt_len (returned as count);
    `media_dirs` as for `prompt_length`."""
    rows, dropped = [], 0
    for i, row in enumerate(dataset):
        row = dict(row)
        row.setdefault("example_id", i)
        if row.get("example_id") is None:
            row["example_id"] = i
        if not SequenceLimits(max_prompt_len=max_prompt_len).prompt_fits(
            prompt_length(tokenizer, row["prompt"], media_dirs)
        ):
            dropped += 1
            continue
        rows.append(row)
    return rows, dropped


# --- rollouts/step_N.jsonl: what each step sampled (and what `--phase update` trains on)

_RECORD_KEYS = (
    "example_id", "task", "prompt", "completion", "answer", "info", "reward", "advantage",
    "metrics", "is_truncated", "error", "stop_condition", "timing",
)


IMAGE_REF = "rollout-image:"  # a stored message's image URL: rollout-image:<index in `images`>


def state_record(state: State, group: int, policy_version: int) -> dict[str, Any]:
    """A JSON-safe record of one rollout: its text, scores, and per-turn token fields.

    Each turn's prompt images are kept as they were sent (data URLs), once per rollout in
    `images`, each turn naming its own by index (`image_refs`): `--phase update` trains on
    exactly these images, never re-rendered (samples.step_image_urls reads them back). The
    record's prompt and completion name those images (rollout-image:<i>) instead of holding a
    second copy; `read_rollouts` puts the URLs back.
    """
    record = {k: state.get(k) for k in _RECORD_KEYS}
    record["group"] = group
    record["policy_version"] = policy_version
    images: dict[str, int] = {}
    record["trajectory"] = []
    for step in state.get("trajectory", []):
        entry = {"tokens": step.get("tokens")}
        urls = message_image_urls(step["prompt"]) if isinstance(step.get("prompt"), list) else []
        if urls:
            entry["image_refs"] = [images.setdefault(url, len(images)) for url in urls]
        record["trajectory"].append(entry)
    if images:
        record["images"] = list(images)

        def refer(url: str) -> str:
            return f"{IMAGE_REF}{images[url]}" if url in images else url

        for key in ("prompt", "completion"):
            record[key] = map_image_urls(record[key], refer)
    return record


def _restore_images(record: dict[str, Any]) -> dict[str, Any]:
    """Undo state_record's image references in the prompt and completion."""
    table = record.get("images") or []

    def url(value: str) -> str:
        index = value[len(IMAGE_REF):]
        known = value.startswith(IMAGE_REF) and index.isdigit() and int(index) < len(table)
        return table[int(index)] if known else value

    if table:
        for key in ("prompt", "completion"):
            record[key] = map_image_urls(record.get(key), url)
    return record


def write_rollouts(path: Path, groups: list[list[State]], policy_version: int) -> None:
    """Write a step's rollouts (atomically: a partial file never looks complete)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for g, group in enumerate(groups):
            for state in group:
                f.write(json.dumps(state_record(state, g, policy_version), default=str) + "\n")
    tmp.rename(path)


def read_rollouts(path: Path) -> tuple[list[list[State]], int]:
    """Groups of rollout records written by `write_rollouts`, and their policy version."""
    groups: dict[int, list[State]] = {}
    version = 0
    for line in path.read_text().splitlines():
        record = _restore_images(json.loads(line))
        version = record.get("policy_version", 0)
        groups.setdefault(record["group"], []).append(record)
    return [groups[g] for g in sorted(groups)], version
