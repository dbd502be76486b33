"""Rollout states: the fresh state of a dataset row, and the state of a rollout that failed.

A state is a plain dict (see `vfkit.types.StateDict` for its keys) so that every consumer of the
classic verifiers contract reads it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vfkit.envs.async_utils import error_text
from vfkit.envs.dataset import clean_messages, parse_info
from vfkit.types import State, StopCondition

InitState = Callable[[dict[str, Any]], State]


def new_state(row: dict[str, Any], task: str) -> State:
    """A fresh state for one rollout of `row`, a formatted dataset row (it has a `prompt`)."""
    return {
        "example_id": row.get("example_id", 0),
        "task": row.get("task") or task,
        "prompt": clean_messages(row["prompt"]),
        "completion": "" if isinstance(row["prompt"], str) else [],
        "answer": "" if row.get("answer") is None else row["answer"],  # 0 / False stay
        "info": parse_info(row.get("info")),
        "reward": None,
        "advantage": None,
        "metrics": {},
        "is_truncated": False,
        "error": None,
        "timing": {"generation_ms": 0.0, "scoring_ms": 0.0, "total_ms": 0.0},
        "stop_condition": None,
        "trajectory": [],
        "responses": [],
        "turn": 0,
    }


def complete_state(
    returned: Any, input: dict[str, Any], init_state: InitState, owner: str
) -> State:
    """The state a custom `rollout()` returned, with the keys it lacks taken from a fresh state
    (a plain dict of prompt/completion/answer is enough); anything but a dict is an error."""
    if not isinstance(returned, dict):
        raise TypeError(
            f"{owner}.rollout() must return the state dict (start from self.init_state(input) "
            f"and return it filled in); it returned {returned!r:.80} ({type(returned).__name__})"
        )
    for key, value in init_state(input).items():
        returned.setdefault(key, value)
    return returned


def failed_state(init_state: InitState, input: dict[str, Any], error: BaseException) -> State:
    """The state of a rollout that raised before returning one (even from a bad input)."""
    try:
        state = init_state(input)
    except Exception:  # the input itself is broken: keep what can be kept
        state = {**init_state({**input, "prompt": []}), "prompt": input.get("prompt")}
    state["error"], state["stop_condition"] = error_text(error), StopCondition.ERROR.value
    return state
