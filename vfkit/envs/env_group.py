"""EnvGroup: several environments trained or evaluated as one.

    env = vf.EnvGroup([math_env, tool_env], env_names=["math", "tools"])

The datasets are concatenated with `task` set to each row's environment name; each rollout is
run by the environment its `task` names and scored by that environment's rubric. Every state
gets every environment's reward-function metrics (0.0 for the others' functions), so rows from
different environments have the same metric keys in logs and tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from datasets import Dataset
from openai import AsyncOpenAI

from vfkit.envs.dataset import rows_to_dataset, unify_content
from vfkit.envs.environment import Environment
from vfkit.errors import ConfigError
from vfkit.types import SamplingArgs, State


class EnvGroupRubric:
    """Scores each state with the rubric of the environment its `task` names; zero-fills metrics."""

    def __init__(self, env_map: dict[str, Environment]) -> None:
        self.env_map = env_map
        self._first: dict[str, tuple[Any, float]] = {}  # name -> (function, weight)
        for env in env_map.values():
            rubric = env.rubric
            for item in zip(rubric.get_reward_func_names(), rubric.get_reward_funcs(),
                            rubric.get_reward_weights(), strict=True):
                self._first.setdefault(item[0], item[1:])
        self.all_names = list(self._first)

    def get_reward_func_names(self) -> list[str]:
        """Every environment's reward function names (each once, in environment order)."""
        return list(self.all_names)

    def get_reward_funcs(self) -> list[Any]:
        """One function per name of `get_reward_func_names` (the first environment's)."""
        return [self._first[name][0] for name in self.all_names]

    def get_reward_weights(self) -> list[float]:
        """One weight per name of `get_reward_func_names`: the first environment's that has a
        function of that name (the verifiers v1 bridge records rewards by these weights)."""
        return [self._first[name][1] for name in self.all_names]

    async def score_rollout(self, state: State) -> None:
        await self.score_group([state])

    async def score_group(self, states: list[State]) -> None:
        by_task: dict[str, list[State]] = {}
        for s in states:
            by_task.setdefault(s.get("task", ""), []).append(s)
        for task, group in by_task.items():
            env = self.env_map.get(task)
            if env is None:
                raise ConfigError(f"no environment named {task!r} in this EnvGroup "
                                  f"(known: {sorted(self.env_map)})")
            await env.rubric.score_group(group)
        for s in states:
            s["metrics"] = {**dict.fromkeys(self.all_names, 0.0), **(s.get("metrics") or {})}


class EnvGroup(Environment):
    """Several environments as one: concatenated datasets, rollouts routed by `task`."""

    def __init__(
        self, envs: Sequence[Environment], env_names: Sequence[str] | None = None, **kwargs: Any
    ) -> None:
        if not envs:
            raise ConfigError("EnvGroup needs at least one environment")
        names = list(env_names) if env_names is not None else [
            e.env_id or f"env_{i}" for i, e in enumerate(envs)
        ]
        if len(names) != len(envs) or len(set(names)) != len(names):
            raise ConfigError(f"EnvGroup needs one unique name per environment, got {names}")
        types = {e.message_type for e in envs}
        if len(types) > 1:
            raise ConfigError(f"EnvGroup environments mix message types {sorted(types)}")
        self.envs, self.env_names = list(envs), names
        self.env_map = dict(zip(names, envs, strict=True))
        kwargs.setdefault("message_type", types.pop())
        super().__init__(
            dataset=self._concat(lambda e: e.dataset),
            eval_dataset=self._concat(lambda e: e.eval_dataset if e.eval_dataset is not None
                                      else e.dataset),
            rubric=EnvGroupRubric(self.env_map),
            **kwargs,
        )

    def _concat(self, pick: Any) -> Dataset | None:
        rows = []
        for name, env in self.env_map.items():
            dataset = pick(env)
            if dataset is not None:
                rows.extend({**row, "task": name} for row in dataset.to_list())
        if not rows:
            return None
        columns = dict.fromkeys(k for row in rows for k in row)
        # every row gets every column (from_list reads the columns off the first row only)
        rows = [{**dict.fromkeys(columns), **row, "example_id": i} for i, row in enumerate(rows)]
        return rows_to_dataset(unify_content(rows), sources=[row["task"] for row in rows])

    def get_env(self, task: str) -> Environment:
        """The environment that runs rows of `task`."""
        if task not in self.env_map:
            raise ConfigError(f"no environment named {task!r} in this EnvGroup "
                              f"(known: {sorted(self.env_map)})")
        return self.env_map[task]

    def set_max_seq_len(self, max_seq_len: int | None) -> None:
        super().set_max_seq_len(max_seq_len)
        for env in self.envs:
            env.set_max_seq_len(max_seq_len)

    async def rollout(
        self, input: dict[str, Any], client: AsyncOpenAI, model: str, sampling_args: SamplingArgs
    ) -> State:
        """Delegate to the environment named by the row's task (its own sampling defaults apply)."""
        env = self.get_env(input.get("task", ""))
        return await env.rollout(input, client, model, env.merge_sampling_args(sampling_args))
