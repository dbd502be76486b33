"""Rubric: a weighted set of reward functions that scores rollouts and groups of rollouts.

A reward function declares the arguments it wants among `prompt, completion, answer, state, task,
info, parser` (plus any object given to the rubric as a keyword); `**kwargs` receives them all.
A group-level function declares plural names (`prompts, completions, answers, states, tasks,
infos`) and returns one score per rollout, e.g. to reward diversity or rank within a group.

A function that raises (or returns a non-number) scores 0 for that rollout; the error is
appended to `state["error"]` and counted in `state["metrics"]["reward_errors"]`, never raised, so
one bad completion cannot kill a batch.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vfkit.envs.async_utils import INTERRUPTS
from vfkit.parsers.parser import Parser
from vfkit.rubrics.call import call_with_declared_args, declares_any, func_name
from vfkit.types import State

ROLLOUT_ARGS = ("prompt", "completion", "answer", "state", "task", "info")
GROUP_ARGS = {
    "prompts": "prompt",
    "completions": "completion",
    "answers": "answer",
    "states": "state",
    "tasks": "task",
    "infos": "info",
}
ERRORS_METRIC = "reward_errors"
logger = logging.getLogger(__name__)

RewardFunc = Callable[..., Any]


@dataclass
class Scores:
    """One rollout's scoring result before it is written into its state."""

    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def merge(self, other: Scores) -> None:
        """Add another rubric's result (rewards and same-named metrics add up)."""
        self.reward += other.reward
        for key, value in other.metrics.items():
            self.metrics[key] = self.metrics.get(key, 0.0) + value
        self.errors.extend(other.errors)


def to_score(value: Any, name: str) -> float:
    """A reward as a finite float; anything else is the reward function's error."""
    if isinstance(value, str | bytes) or value is None:
        raise TypeError(f"{name} returned {value!r}; a reward function must return a number")
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"{name} returned {score}; rewards must be finite")
    return score


def rollout_args(state: State) -> dict[str, Any]:
    """The per-rollout arguments a reward function may declare, read from its state."""
    return {
        "prompt": state.get("prompt"),
        "completion": state.get("completion"),
        "answer": state.get("answer", ""),
        "state": state,
        "task": state.get("task", "default"),
        "info": state.get("info") or {},
        "example_id": state.get("example_id"),
    }


def share_parser(rubric: Any, parser: Parser, owner: str) -> None:
    """Hand an environment's own parser to its rubric; warn when the rubric has another one.

    A rubric built without a parser would otherwise parse with a plain Parser, and functions
    that declare `parser` would silently score 0 on, say, XMLParser output.
    """
    if not hasattr(rubric, "set_default_parser"):
        return  # not a vfkit Rubric (EnvGroup's router, a caller's own object)
    rubric.set_default_parser(parser)
    theirs = rubric.parser
    if theirs is not parser and (type(theirs) is not type(parser) or vars(theirs) != vars(parser)):
        logger.warning(
            "%s: the rubric's parser (%s) differs from the environment's (%s); reward functions "
            "that declare `parser` get the rubric's. Pass the same parser to both, or build the "
            "rubric without one to use the environment's", owner, type(theirs).__name__,
            type(parser).__name__,
        )


def record_error(state: State, message: str) -> None:
    """Append `message` to the state's error (an earlier rollout error is kept, not replaced)."""
    previous = state.get("error")
    state["error"] = f"{previous}; {message}" if previous else message


class Rubric:
    """Weighted reward functions: reward = sum(weight * score); each score is also a metric.

    >>> def exact(completion, answer) -> float:
    ...     return float(completion[-1]["content"].strip() == answer)
    >>> rubric = Rubric(funcs=[exact], weights=[1.0])
    >>> state = {"completion": [{"role": "assistant", "content": "4"}], "answer": "4"}
    >>> asyncio.run(rubric.score_rollout(state)); state["reward"], state["metrics"]["exact"]
    (1.0, 1.0)
    """

    def __init__(
        self,
        funcs: Sequence[RewardFunc] | None = None,
        weights: Sequence[float] | None = None,
        parser: Parser | None = None,
        **kwargs: Any,
    ) -> None:
        self.parser = parser if parser is not None else Parser()
        self.parser_given = parser is not None  # else the environment's parser replaces it
        self.funcs: list[RewardFunc] = []
        self.weights: list[float] = []
        # Objects reward functions may declare by name, beyond the rollout's own fields.
        self.class_objects: dict[str, Any] = {"parser": self.parser}
        for key, value in kwargs.items():
            setattr(self, key, value)
            self.class_objects[key] = value
        funcs = list(funcs or [])
        weights = [1.0] * len(funcs) if weights is None else list(weights)
        if len(weights) != len(funcs):
            raise ValueError(
                f"Rubric got {len(funcs)} reward functions but {len(weights)} weights; "
                "give one weight per function (or none for all 1.0)"
            )
        for func, weight in zip(funcs, weights, strict=True):
            self.add_reward_func(func, weight)

    def add_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        """Add a reward function; its name (unique in the rubric) becomes its metrics key."""
        if not callable(func):
            raise TypeError(f"reward function {func!r} is not callable")
        name = func_name(func)
        if name in self.get_reward_func_names():
            raise ValueError(
                f"two reward functions are named {name!r}; metrics are keyed by name, "
                "so give each function its own name"
            )
        self.funcs.append(func)
        self.weights.append(float(weight))

    def set_default_parser(self, parser: Parser) -> None:
        """Use `parser` (its environment's) when the rubric was built without one of its own."""
        if not self.parser_given:
            self.parser = self.class_objects["parser"] = parser

    def get_reward_funcs(self) -> list[RewardFunc]:
        """The reward functions, in order."""
        return list(self.funcs)

    def get_reward_weights(self) -> list[float]:
        """The weights, one per reward function."""
        return list(self.weights)

    def get_reward_func_names(self) -> list[str]:
        """The metric names of the reward functions, in order."""
        return [func_name(func) for func in self.funcs]

    # The underscore names verifiers of early 2026 (and prime-rl with them) call.
    def _get_reward_func_names(self) -> list[str]:
        return self.get_reward_func_names()

    def _get_reward_funcs(self) -> list[RewardFunc]:
        return self.get_reward_funcs()

    def _get_reward_weights(self) -> list[float]:
        return self.get_reward_weights()

    async def score_rollout(self, state: State) -> None:
        """Score one rollout in place (group-level functions see a group of one)."""
        await self.score_group([state])

    async def score_group(self, states: list[State]) -> None:
        """Score a group in place: sets state["reward"] and state["metrics"][name] for each."""
        results = await self.compute_scores(states)
        for state, result in zip(states, results, strict=True):
            state["reward"] = result.reward
            metrics = state.get("metrics")
            state["metrics"] = metrics = metrics if isinstance(metrics, dict) else {}
            metrics.update(result.metrics)
            for message in result.errors:
                record_error(state, message)

    async def compute_scores(self, states: list[State]) -> list[Scores]:
        """Scores for each state, without touching the states.

        A state that already carries an error (its generation failed) is not scored: it gets
        reward 0 and zero metrics, so every rollout has the same metrics keys.
        """
        names = [func_name(func) for func in self.funcs]  # own functions only (see RubricGroup)
        results = [Scores(metrics=dict.fromkeys([*names, ERRORS_METRIC], 0.0)) for _ in states]
        live = [i for i, state in enumerate(states) if not state.get("error")]
        jobs = []
        for func, weight, name in zip(self.funcs, self.weights, names, strict=True):
            if declares_any(func, set(GROUP_ARGS)):
                jobs.append(self._run_group_func(func, weight, name, states, live, results))
            else:
                jobs.extend(
                    self._run_rollout_func(func, weight, name, states[i], results[i]) for i in live
                )
        await asyncio.gather(*jobs)
        return results

    async def _run_rollout_func(
        self, func: RewardFunc, weight: float, name: str, state: State, result: Scores
    ) -> None:
        try:
            value = await call_with_declared_args(
                func, {**self.class_objects, **rollout_args(state)}
            )
            score = to_score(value, name)
        except INTERRUPTS:
            raise
        except BaseException as exc:  # SystemExit too: one function must not end the batch
            _fail(result, name, exc)
            return
        result.metrics[name] = score
        result.reward += weight * score

    async def _run_group_func(
        self,
        func: RewardFunc,
        weight: float,
        name: str,
        states: list[State],
        live: list[int],
        results: list[Scores],
    ) -> None:
        if not live:
            return
        per_rollout = [rollout_args(states[i]) for i in live]
        available = dict(self.class_objects)
        for plural, singular in GROUP_ARGS.items():
            available[plural] = [args[singular] for args in per_rollout]
        try:
            values = await call_with_declared_args(func, available)
            if isinstance(values, str | bytes) or len(values) != len(live):  # TypeError: no len
                raise ValueError(
                    f"group reward function {name} returned {values!r:.80}; "
                    f"expected a list of {len(live)} scores, one per rollout"
                )
            scores = [to_score(value, name) for value in values]
        except INTERRUPTS:
            raise
        except BaseException as exc:
            for i in live:
                _fail(results[i], name, exc)
            return
        for i, score in zip(live, scores, strict=True):
            results[i].metrics[name] = score
            results[i].reward += weight * score


def _fail(result: Scores, name: str, exc: BaseException) -> None:
    """Record a reward function's failure: score 0, one more error, a message for the state."""
    result.metrics[name] = 0.0
    result.metrics[ERRORS_METRIC] = result.metrics.get(ERRORS_METRIC, 0.0) + 1.0
    result.errors.append(f"reward function {name} raised {type(exc).__name__}: {exc}")
