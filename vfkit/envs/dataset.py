"""Dataset formatting: turn rows with a `question` into the `prompt` column rollouts start from.

Rows leave here with `prompt` (chat messages, or a str in completion mode), `example_id` (int),
`task` (str) and, when the source has them, `answer` and `info`.

Images: a row built from `question` may also have an `image` column (one image) and/or an
`images` column (a list) — PIL images (a `datasets.Image` column), encoded bytes, data URLs or
local paths. They become image content parts placed before the question in the user message
(`[image, ..., {"type": "text", "text": question}]`), and the image columns are dropped: the
pixels now live in the prompt as data URLs. Every message of such a prompt has part-list content
(the system prompt too) because an Arrow column holds one type. A row that already has a
`prompt` keeps it as is: put its images there with `vfkit.images.image_part`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import datasets
import pyarrow as pa
from datasets import Dataset

from vfkit.envs.content import as_parts, drop_none_keys, image_parts, text_part
from vfkit.errors import ConfigError
from vfkit.types import Message, Messages

IMAGE_COLUMNS = ("image", "images")
logger = logging.getLogger(__name__)


def build_prompt(
    question: str,
    *,
    system_prompt: str | None = None,
    few_shot: Sequence[Message] | None = None,
    message_type: str = "chat",
    images: Sequence[Any] | None = None,
) -> Messages:
    """The prompt for one question: system prompt, few-shot messages, then the question.

    With `images` (PIL images, bytes, URLs or image parts; an empty list too) the user message
    is the images' parts, then the question, and every message's content is a list of parts.
    """
    if message_type == "completion":
        if images:
            raise ConfigError("images need message_type='chat' (a completion prompt is text)")
        return f"{system_prompt}\n\n{question}" if system_prompt else question
    messages: list[Message] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.extend(copy.deepcopy(list(few_shot or [])))
    if images is None:
        messages.append({"role": "user", "content": question})
        return messages
    messages = [{**m, "content": as_parts(m.get("content"))} for m in messages]
    messages.append({"role": "user", "content": [*image_parts(list(images)), text_part(question)]})
    return messages


def row_image_parts(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The image parts of a row's `image` and `images` columns, in that order (None: the row
    has neither column, so its prompt stays text)."""
    if not any(column in row for column in IMAGE_COLUMNS):
        return None
    return [part for column in IMAGE_COLUMNS for part in image_parts(row.get(column))]


def unify_content(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose chat prompts all use part-list content once any of them does (an Arrow column
    holds one type: an image environment's rows beside a text environment's, as in EnvGroup)."""
    chats = [r["prompt"] for r in rows if isinstance(r.get("prompt"), list)]
    if not any(isinstance(m.get("content"), list) for chat in chats for m in chat):
        return rows
    return [
        {**r, "prompt": [{**m, "content": as_parts(m.get("content"))} for m in r["prompt"]]}
        if isinstance(r.get("prompt"), list) else r
        for r in rows
    ]


def clean_messages(messages: Messages) -> Messages:
    """Deep-copy messages and drop None-valued keys (Arrow fills absent struct fields with None)."""
    if isinstance(messages, str):
        return messages
    cleaned = []
    for m in messages:
        message = {k: copy.deepcopy(v) for k, v in dict(m).items() if v is not None}
        if isinstance(message.get("content"), list):
            message["content"] = [drop_none_keys(part) for part in message["content"]]
        cleaned.append(message)
    return cleaned


def parse_info(info: Any) -> dict[str, Any]:
    """A row's `info` as a dict (datasets sometimes store it as a JSON string)."""
    if info is None:
        return {}
    if isinstance(info, str):
        try:
            info = json.loads(info) if info.strip() else {}
        except json.JSONDecodeError:
            return {"text": info}
    return dict(info) if isinstance(info, dict) else {"value": info}


def format_row(
    row: dict[str, Any],
    index: int,
    *,
    system_prompt: str | None,
    few_shot: Sequence[Message] | None,
    message_type: str,
    task: str,
) -> dict[str, Any]:
    """Add prompt/example_id/task to one row, building the prompt from `question` if needed."""
    out = dict(row)
    if out.get("prompt") is None:
        if "question" not in out:
            raise ConfigError(
                f"dataset row {index} has neither 'prompt' nor 'question' (columns: "
                f"{sorted(out)}); give each row one of them"
            )
        if not isinstance(out["question"], str):
            raise ConfigError(
                f"dataset row {index}: 'question' must be a str, not {out['question']!r:.60} "
                f"({type(out['question']).__name__}); convert it (str(...)) or drop the row"
            )
        out["prompt"] = build_prompt(
            out["question"], system_prompt=system_prompt, few_shot=few_shot,
            message_type=message_type, images=row_image_parts(out),
        )
        for column in IMAGE_COLUMNS:
            out.pop(column, None)  # the pixels live in the prompt now
    elif system_prompt and isinstance(out["prompt"], list):
        prompt = list(out["prompt"])
        if not prompt or prompt[0].get("role") != "system":
            multimodal = any(isinstance(m.get("content"), list) for m in prompt)
            content = as_parts(system_prompt) if multimodal else system_prompt
            out["prompt"] = [{"role": "system", "content": content}, *prompt]
    if out.get("example_id") is None:
        out["example_id"] = index
    if not out.get("task"):
        out["task"] = task
    return out


def replace_system_prompt(prompt: Messages | str, system_prompt: str) -> Messages | str:
    """`prompt` with `system_prompt` in place of its own (e.g. a prompt optimiser's candidate):
    a chat prompt's leading system message is replaced (or one is added); a completion prompt
    gets it in front."""
    if isinstance(prompt, str):
        return f"{system_prompt}\n\n{prompt}"
    rest = list(prompt)
    while rest and rest[0].get("role") == "system":
        rest.pop(0)
    multimodal = any(isinstance(m.get("content"), list) for m in rest)
    content = as_parts(system_prompt) if multimodal else system_prompt
    return [{"role": "system", "content": content}, *rest]


def format_dataset(
    dataset: Dataset | Sequence[dict[str, Any]] | None,
    *,
    system_prompt: str | None = None,
    few_shot: Sequence[Message] | None = None,
    message_type: str = "chat",
    task: str = "default",
) -> Dataset | None:
    """A datasets.Dataset with the columns rollouts need (see module doc); None stays None.

    `few_shot` goes between the system prompt and the question of rows built from `question`:
    it is a ConfigError in completion mode, and a warning for a dataset with a `prompt` column
    (its prompts are used as they are).
    """
    if few_shot and message_type == "completion":
        raise ConfigError("few_shot needs message_type='chat' (it is a list of chat messages); "
                          "in completion mode write the examples into system_prompt or the "
                          "prompt column instead")
    if dataset is None:
        return None
    if not isinstance(dataset, Dataset):
        dataset = rows_to_dataset([dict(r) for r in dataset])
    if few_shot and "prompt" in dataset.column_names:
        logger.warning("few_shot is not used: the dataset has a 'prompt' column, whose prompts "
                       "are used as they are; put the examples into those prompts, or give the "
                       "rows a 'question' column instead")
    kwargs = {"system_prompt": system_prompt, "few_shot": few_shot,
              "message_type": message_type, "task": task}
    consumed = [c for c in IMAGE_COLUMNS if c in dataset.column_names]
    if "prompt" in dataset.column_names:
        consumed = []  # rows with a prompt keep it (and their columns) as they are
    with quiet_datasets():
        return dataset.map(lambda row, i: format_row(row, i, **kwargs), with_indices=True,
                           remove_columns=consumed or None)


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """No "Map: 100%" progress bars while formatting (restores the previous setting)."""
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def rows_to_dataset(rows: list[dict[str, Any]], sources: Sequence[str] | None = None) -> Dataset:
    """`Dataset.from_list(rows)`; a column whose values Arrow cannot hold as one type is a
    ConfigError naming the column and two rows that clash (with each row's source, e.g. the
    EnvGroup environment it came from, when `sources` gives one per row)."""
    try:
        return Dataset.from_list(rows)
    except pa.ArrowException as e:
        raise ConfigError(type_clash(rows, e, sources)) from e


def type_clash(rows: list[dict[str, Any]], error: Exception, sources: Sequence[str] | None) -> str:
    """What to tell the author when `rows` do not fit one Arrow schema (see rows_to_dataset)."""

    def where(i: int) -> str:
        source = f" (environment {sources[i]!r})" if sources is not None else ""
        value = rows[i].get(column)
        return f"row {i}{source} has {value!r:.60} ({type(value).__name__})"

    for column in dict.fromkeys(k for row in rows for k in row):
        pair = clashing_rows([row.get(column) for row in rows])
        if pair is not None:
            return (f"dataset column {column!r} mixes types that Arrow cannot store in one "
                    f"column: {where(pair[0])}, {where(pair[1])}; give the column one type in "
                    "every row (e.g. str(...) each value; for dicts such as info, the same value "
                    "type under each key)")
    return f"the dataset rows do not fit one Arrow schema ({error}); give each column one type"


def clashing_rows(values: list[Any]) -> tuple[int, int] | None:
    """Two indices of `values` that Arrow cannot put in one array (None when all fit)."""
    try:
        pa.array(values)
        return None
    except pa.ArrowException:
        pass
    present = [i for i, value in enumerate(values) if value is not None]
    for j in present[1:]:
        try:
            pa.array([values[present[0]], values[j]])
        except pa.ArrowException:
            return present[0], j
    return None


def select(dataset: Dataset, n: int = -1, seed: int | None = None) -> Dataset:
    """Shuffle with `seed` (when given), then keep the first `n` rows (all when n < 0)."""
    if seed is not None:
        dataset = dataset.shuffle(seed=seed)
    if n is not None and n >= 0:
        dataset = dataset.select(range(min(n, len(dataset))))
    return dataset
