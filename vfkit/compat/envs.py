"""Classic verifiers 0.1.x environment classes, as thin layers over vfkit's own.

Each class here is the vfkit class plus what 0.1.x code expects of it:

- constructor arguments of 0.1.x: `oai_tools` (sent with every model call), `score_rollouts`;
  `max_workers` / `map_kwargs` / `interleaved_rollouts` are accepted with a warning (they tune
  machinery vfkit does not have); `tool_defs` / `pass_threshold` are refused by name; any other
  keyword becomes an attribute, as in classic;
- `MultiTurnEnv(max_turns=-1)`: no turn limit by default; stop conditions checked in classic's
  order (priority, then name); an `is_completed(messages, state)` override (0.1.3-0.1.7 style)
  decides alone, after vfkit's context-full check;
- per-example tools: `info["oai_tools"]` replaces the environment's tools for that row;
- ToolEnv / StatefulToolEnv: see `vfkit.compat.tool_envs`;
- classic generate / evaluate: `generate(inputs, ...)` groups rows by `example_id`,
  `evaluate` is async, `generate_sync` / `evaluate_sync` block, `score_rollouts`,
  `max_concurrent_generation`, `save_results` / `results_path` / `save_every`,
  `state_columns`, and results readable as `results["reward"]`; `make_dataset(results)`.

vfkit's engine still runs every rollout (token ids, masks, logprobs from the server), so these
environments train with vf-train unchanged.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset

from vfkit.client.sampling import seed_groups
from vfkit.compat.hooks import marked_methods, run_teardown
from vfkit.compat.outputs import ClassicOutputs, ResultsSaver, build_metadata
from vfkit.envs import env_group as _group
from vfkit.envs import environment as _env
from vfkit.envs import multiturn_env as _mt
from vfkit.envs import singleturn_env as _st
from vfkit.envs.async_utils import error_text, maybe_await, own_connections, run_sync
from vfkit.envs.multiturn_env import stop as _vfkit_stop
from vfkit.errors import ConfigError
from vfkit.evaluation.results import state_to_row
from vfkit.types import SamplingArgs, State, StopCondition

logger = logging.getLogger(__name__)
# (client, model, sampling_args) of the rollout running in this task: classic states carry them
_CALL: contextvars.ContextVar[tuple[Any, str, Any]] = contextvars.ContextVar("vfkit_classic_call")

# classic constructor arguments that tune machinery vfkit does not have (a warning names them)
NO_EFFECT_ARGS = {
    "max_workers": "sync tools and hooks run in asyncio's default thread pool",
    "map_kwargs": "datasets are formatted in-process with Dataset.map defaults",
    "interleaved_rollouts": "vf-train decides per rollout whether its turns extend each other "
                            "(state['trajectory_extends'])",
}
# classic arguments whose meaning vfkit cannot honour: refused, with what to do instead
REFUSED_ARGS = {
    "tool_defs": "pass OpenAI tool schemas as oai_tools=[...] or functions as ToolEnv(tools=...)",
    "pass_threshold": "vfkit computes no pass@k metrics; compute them from the saved rewards",
}


def stop(func: Callable[..., Any] | None = None, *, priority: int = 0) -> Any:
    """Classic `@vf.stop`: marks a stop condition (higher priority first, then by name)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.stop, fn.stop_priority = True, priority  # type: ignore[attr-defined]  # classic's
        return _vfkit_stop(fn, priority=priority)

    return mark(func) if func is not None else mark


def _parse_tools(value: Any) -> list[dict[str, Any]] | None:
    """A row's `info["oai_tools"]`: a list of schemas, possibly stored as a JSON string."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else None
    return list(value) if value else None


class Environment(_env.Environment):
    """vfkit's Environment with classic 0.1.x constructor arguments and generate/evaluate."""

    def __init__(self, *args: Any, oai_tools: list[dict[str, Any]] | None = None,
                 score_rollouts: bool = True, **kwargs: Any) -> None:
        """Positional arguments go where the vfkit class takes them (`dataset`, ...;
        EnvGroup: `envs`, as in `vf.EnvGroup([env1, env2], env_names=[...])`)."""
        for name, what in REFUSED_ARGS.items():
            if name in kwargs:
                raise ConfigError(f"{type(self).__name__}: the classic argument {name}= is not "
                                  f"supported by vfkit: {what}")
        for name, why in NO_EFFECT_ARGS.items():
            if name in kwargs:
                value = kwargs.pop(name)
                logger.warning("%s=%r has no effect in vfkit: %s", name, value, why)
        super().__init__(*args, **kwargs)
        self.classic_oai_tools = list(oai_tools) if oai_tools else None
        self.score_rollouts = score_rollouts
        if marked_methods(self, "teardown"):
            atexit.register(run_teardown, self)

    def tools_for(self, state: State) -> list[dict[str, Any]] | None:
        """`state["oai_tools"]` when a hook set it (None: no tools this rollout), then per-row
        tools (`info["oai_tools"]`), then the environment's own."""
        if "oai_tools" in state:
            return _parse_tools(state["oai_tools"])
        own = _parse_tools((state.get("info") or {}).get("oai_tools"))
        if own is not None:
            return own
        parent = getattr(super(), "tools_for", None)
        found = parent(state) if parent is not None else None
        return found or self.classic_oai_tools

    async def run_group(self, *args: Any, score: bool | None = None,
                        **kwargs: Any) -> list[State]:
        """vfkit's run_group; unscored (reward 0) when built with score_rollouts=False."""
        score = self.score_rollouts if score is None else score
        return await super().run_group(*args, score=score, **kwargs)

    # ----- classic generate / evaluate -----
    async def generate(  # type: ignore[override]  # superset of vfkit's signature
        self, inputs: Dataset | Sequence[dict[str, Any]], client: Any, model: str,
        sampling_args: dict[str, Any] | None = None, **kwargs: Any,
    ) -> ClassicOutputs:
        """Run `inputs` as groups and score them (keyword arguments: `generate_with`).

        `client` may be a sync `openai.OpenAI` (classic callers pass one): the rollouts run on
        an async client with its URL and key, closed when they are done.
        """
        async with _async_client(client) as usable:
            return await self.generate_with(inputs, usable, model, sampling_args, **kwargs)

    async def generate_with(
        self, inputs: Dataset | Sequence[dict[str, Any]], client: Any, model: str,
        sampling_args: dict[str, Any] | None = None, *, rollouts_per_example: int | None = None,
        score_rollouts: bool | None = None, max_concurrent: int = -1,
        max_concurrent_generation: int | None = None, max_concurrent_scoring: int | None = None,
        results_path: str | Path | None = None, state_columns: list[str] | None = None,
        save_results: bool = False, save_every: int = -1, use_tqdm: bool = False,
        on_group: Callable[[list[State]], Any] | None = None,
        rollout_indices: Mapping[Any, Sequence[int]] | None = None,
    ) -> ClassicOutputs:
        """Run `inputs` as groups and score them; states in input order.

        Rows sharing an `example_id` form one group (classic 0.1.8: inputs come repeated);
        with `rollouts_per_example` (vfkit / vf-eval), each row is run that many times instead.
        `use_tqdm` is accepted for classic callers; progress is shown by vf-eval, not here.
        `rollout_indices`: example_id -> which rollouts of its group these are (vfkit's).
        """
        from vfkit.client.client_config import resolve_client

        client = resolve_client(client)
        groups = _groups([dict(r) for r in inputs], rollouts_per_example)
        gen_n = _limit(max_concurrent_generation, max_concurrent, self.max_concurrent)
        score_n = _limit(max_concurrent_scoring, max_concurrent, self.max_concurrent_scoring)
        gen_sem = asyncio.Semaphore(gen_n) if gen_n > 0 else None
        score_sem = asyncio.Semaphore(score_n) if score_n > 0 else None
        args = self.merge_sampling_args(sampling_args)  # what ran, for the metadata
        saver = None
        if save_results:
            path = Path(results_path) if results_path else _default_results_path(self, model)
            saver = ResultsSaver(path, state_columns, save_every)
        start = time.monotonic()

        async def one_group(group: list[dict[str, Any]], group_args: SamplingArgs) -> list[State]:
            indices = (rollout_indices or {}).get(group[0].get("example_id"))
            states = await self.run_group(group, client, model, group_args,
                                          score=score_rollouts,
                                          gen_sem=gen_sem, score_sem=score_sem,
                                          state_columns=state_columns, rollout_indices=indices)
            if saver is not None:
                saver.add_group(states)
            if on_group is not None:
                await maybe_await(on_group(states))
            return states

        per_group = seed_groups(args, [g[0] for g in groups])  # as vfkit's generate
        done = await asyncio.gather(*(one_group(g, a) for g, a in
                                      zip(groups, per_group, strict=True)))
        states = [s for group in done for s in group]
        meta = build_metadata(self, model, client, states, args, state_columns,
                              saver.run_dir if saver else None, time.monotonic() - start)
        if saver is not None:
            saver.finish(meta)
        return ClassicOutputs(states=states, metadata=meta)

    def generate_sync(self, inputs: Dataset | Sequence[dict[str, Any]], client: Any,
                      *args: Any, **kwargs: Any) -> ClassicOutputs:
        """Blocking `generate`; `client` may be a sync `OpenAI` client."""
        return run_sync(_with_own_connections(self.generate, inputs, client, *args, **kwargs))

    def get_eval_inputs(self, num_examples: int = -1,
                        rollouts_per_example: int = 1) -> list[dict[str, Any]]:
        """Classic name of `_get_eval_inputs`: eval rows repeated `rollouts_per_example` times."""
        return self._get_eval_inputs(num_examples, rollouts_per_example)

    async def evaluate(  # type: ignore[override]  # classic: async
        self, client: Any, model: str, sampling_args: dict[str, Any] | None = None,
        num_examples: int = -1, rollouts_per_example: int = 1, **kwargs: Any,
    ) -> ClassicOutputs:
        """Roll out the eval rows `rollouts_per_example` times each (classic 0.1.8: async).

        Takes generate's keyword arguments (save_results, results_path, state_columns, ...).
        """
        seed = kwargs.pop("seed", None)
        rows = [dict(r) for r in self.get_eval_dataset(n=num_examples, seed=seed)]
        return await self.generate(rows, client, model, sampling_args,
                                   rollouts_per_example=rollouts_per_example, **kwargs)

    def evaluate_sync(self, client: Any, model: str, *args: Any, **kwargs: Any) -> ClassicOutputs:
        """Blocking `evaluate`; `client` may be a sync `OpenAI` client."""
        return run_sync(_with_own_connections(self.evaluate, client, model, *args, **kwargs))

    def make_dataset(self, results: ClassicOutputs, push_to_hub: bool = False,
                     hub_name: str | None = None, state_columns: list[str] | None = None,
                     **kwargs: Any) -> Dataset:
        """A Dataset of the results' rows (prompt, completion, answer, reward, metrics, ...)."""
        rows = [state_to_row(s, 0, state_columns or []) for s in results.states]
        dataset = Dataset.from_list(rows)
        if push_to_hub:
            dataset.push_to_hub(hub_name or f"{self.env_id or 'vfkit'}-results", **kwargs)
        return dataset


class MultiTurnEnv(Environment, _mt.MultiTurnEnv):
    """Classic MultiTurnEnv: no turn limit by default, classic stop-check order."""

    def __init__(self, max_turns: int = -1, **kwargs: Any) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        override = type(self).is_completed
        if override is not MultiTurnEnv.is_completed and _takes_messages(override):
            self._classic_is_completed = self.is_completed
            self.is_completed = self._check_classic_override  # type: ignore[method-assign]

    def _collect_stop_conditions(self) -> list[tuple[str, Callable[..., Any]]]:
        """Classic order: higher priority first, ties by name; no stop at a truncated reply."""
        found: dict[str, int] = {}
        for klass in reversed(type(self).__mro__):
            for name, attr in vars(klass).items():
                if callable(attr) and hasattr(attr, "__vf_stop__"):
                    found[name] = attr.__vf_stop__
        found.pop("max_tokens_reached", None)  # classic keeps going after a cut-off reply
        ordered = sorted(found.items(), key=lambda item: (-item[1], item[0]))
        return [(name, getattr(self, name)) for name, _ in ordered]

    # classic stop conditions are coroutines: subclasses `await self.max_turns_reached(state)`
    @stop
    async def prompt_too_long(self, state: State) -> bool:
        return bool(state.get("prompt_too_long"))

    @stop
    async def max_turns_reached(self, state: State) -> bool:
        return self.max_turns > 0 and state["turn"] >= self.max_turns

    @stop(priority=100)
    async def has_final_env_response(self, state: State) -> bool:
        """verifiers 0.1.9+: the environment ended the rollout by setting
        `state["final_env_response"]` (its last messages), so no model turn follows."""
        return state.get("final_env_response") is not None

    async def is_completed(self, *args: Any, **kwargs: Any) -> bool:  # type: ignore[override]
        """`is_completed(state)` (vfkit) or `is_completed(messages, state)` (classic)."""
        state = kwargs.get("state", args[-1] if args else None)
        return await _mt.MultiTurnEnv.is_completed(self, state)

    async def rollout(self, input: dict[str, Any], client: Any, model: str,
                      sampling_args: dict[str, Any]) -> State:
        """vfkit's rollout loop, then the classic `@vf.cleanup` hooks."""
        token = _CALL.set((client, model, sampling_args))
        try:
            state = await super().rollout(input, client, model, sampling_args)
        finally:
            _CALL.reset(token)
        state.pop("client", None)  # a live object: not part of the results
        _end_with_final_response(state)
        for hook in marked_methods(self, "cleanup"):
            try:
                await maybe_await(hook(state))
            except Exception as e:  # recorded like any rollout failure
                state["error"] = state.get("error") or f"cleanup {hook.__name__}: {error_text(e)}"
        return state

    def init_state(self, input: dict[str, Any]) -> State:
        """vfkit's state plus the classic keys `input`, `client`, `model` and `sampling_args`
        (self-play environments call the model from env_response through them)."""
        state = super().init_state(input)
        state["input"] = dict(input)
        call = _CALL.get(None)
        if call is not None:
            state["client"], state["model"], state["sampling_args"] = call
        return state

    async def _check_classic_override(self, state: State) -> bool:
        """The subclass's `is_completed(messages, state)` decides (after errors / full context)."""
        if state.get("error"):
            state["stop_condition"] = StopCondition.ERROR.value
            return True
        if state.get("prompt_too_long"):
            state["stop_condition"] = StopCondition.PROMPT_TOO_LONG.value
            return True
        if await maybe_await(self._classic_is_completed(self.current_prompt(state), state)):
            state["stop_condition"] = state.get("stop_condition") or StopCondition.COMPLETED.value
            return True
        return False


class SingleTurnEnv(MultiTurnEnv, _st.SingleTurnEnv):
    """Classic SingleTurnEnv: one model call per rollout."""


class EnvGroup(Environment, _group.EnvGroup):
    """Classic EnvGroup: several environments as one, rows routed by `task`."""


def _end_with_final_response(state: State) -> None:
    """The completion ends with `state["final_env_response"]` (already there when env_response
    also returned it, as classic environments usually do)."""
    final = state.get("final_env_response")
    if final is None or state.get("stop_condition") != "has_final_env_response":
        return
    if isinstance(state["completion"], str):
        if not state["completion"].endswith(str(final)):
            state["completion"] += str(final)
        return
    messages = [{"role": "user", "content": final}] if isinstance(final, str) else list(final)
    if state["completion"][-len(messages):] != messages:
        state["completion"].extend(messages)


def _takes_messages(method: Callable[..., Any]) -> bool:
    """True for a classic `is_completed(self, messages, state, ...)` signature."""
    params = [p for p in inspect.signature(method).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) >= 3 or "messages" in inspect.signature(method).parameters


async def _with_own_connections(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`method(*args)` with its client (the argument that is one) on a connection pool of its
    own: a blocking call's event loop ends with it, and the caller's client must outlive it."""
    from openai import AsyncOpenAI

    index = next((i for i, a in enumerate(args) if isinstance(a, AsyncOpenAI)), None)
    if index is None:
        return await method(*args, **kwargs)
    async with own_connections(args[index]) as own:
        return await method(*args[:index], own, *args[index + 1:], **kwargs)


@contextlib.asynccontextmanager
async def _async_client(client: Any) -> AsyncIterator[Any]:
    """A sync `openai.OpenAI` as an AsyncOpenAI with the same URL and key (classic did), closed
    on exit in the loop that used it (left open, its pool's cleanup later hit a closed loop)."""
    from openai import AsyncOpenAI, OpenAI

    if not isinstance(client, OpenAI):
        yield client
        return
    made = AsyncOpenAI(api_key=client.api_key, base_url=client.base_url)
    try:
        yield made
    finally:
        await made.close()


def _groups(rows: list[dict[str, Any]], per_example: int | None) -> list[list[dict[str, Any]]]:
    """Rows as groups: `per_example` copies of each row, or rows grouped by example_id."""
    if per_example is not None:
        return [[dict(row) for _ in range(per_example)] for row in rows]
    by_id: dict[Any, list[dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        by_id.setdefault(row.get("example_id", f"row-{i}"), []).append(row)
    return list(by_id.values())


def _limit(*candidates: int | None) -> int:
    """The first given concurrency limit that is set (> 0); 0 means unbounded."""
    for value in candidates:
        if value is not None and value > 0:
            return value
    return 0


def _default_results_path(env: Any, model: str) -> Path:
    from vfkit.evaluation.config import DEFAULT_OUTPUT_DIR
    from vfkit.evaluation.runner import new_run_dir

    return new_run_dir(Path(DEFAULT_OUTPUT_DIR), env.env_id or "env", model)
