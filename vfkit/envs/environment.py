"""Environment: a dataset, a rollout loop and a rubric; plus the async rollout engine around them.

The engine runs rollouts against any OpenAI-compatible endpoint, groups them, scores groups with
the rubric and hands back states that carry per-turn token ids and sampling logprobs:

    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[exact]))
    out = env.evaluate(AsyncOpenAI(base_url=..., api_key="x"), "my-model", num_examples=8,
                       rollouts_per_example=4)
    out.reward        # one float per rollout; out.states has the full states

A rollout that raises is data, not a crash: its state gets `error` ("Type: message"),
reward 0, and the rest of its group and batch carry on.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from datasets import Dataset
from openai import AsyncOpenAI

from vfkit.advantage import set_group_advantages
from vfkit.client.client_config import resolve_client
from vfkit.client.sampling import merge_sampling_args, seed_groups, seed_rollouts
from vfkit.envs.async_utils import (
    INTERRUPTS,
    error_text,
    maybe_await,
    own_connections,
    run_sync,
)
from vfkit.envs.dataset import format_dataset, format_row, select
from vfkit.envs.model_calls import ModelCalls
from vfkit.envs.outputs import GenerateOutputs
from vfkit.envs.state import complete_state, failed_state, new_state
from vfkit.errors import ConfigError
from vfkit.types import Message, SamplingArgs, State

__all__ = ["Environment", "GenerateOutputs"]

logger = logging.getLogger(__name__)
OnGroup = Callable[[list[State]], Any]


class Environment(ModelCalls):
    """Base class: owns the dataset, parser, rubric and the rollout engine; subclasses `rollout`.

    Most environments subclass MultiTurnEnv / SingleTurnEnv / ToolEnv rather than this class.
    """

    def __init__(
        self,
        dataset: Dataset | Sequence[dict[str, Any]] | None = None,
        eval_dataset: Dataset | Sequence[dict[str, Any]] | None = None,
        system_prompt: str | None = None,
        few_shot: list[Message] | None = None,
        parser: Any = None,
        rubric: Any = None,
        sampling_args: SamplingArgs | None = None,
        message_type: str = "chat",
        max_seq_len: int | None = None,
        env_id: str | None = None,
        env_args: dict[str, Any] | None = None,
        max_concurrent: int = -1,
        max_concurrent_scoring: int = -1,
        timeout: float | None = 600.0,
        max_retries: int = 3,
        **kwargs: Any,
    ) -> None:
        if message_type not in ("chat", "completion"):
            raise ConfigError(f"message_type must be 'chat' or 'completion', not {message_type!r}")
        self.message_type = message_type
        self.system_prompt, self.few_shot = system_prompt, few_shot
        self.env_id, self.env_args = env_id, dict(env_args or {})
        fmt = {"system_prompt": system_prompt, "few_shot": few_shot,
               "message_type": message_type, "task": env_id or "default"}
        self.dataset = format_dataset(dataset, **fmt)
        self.eval_dataset = format_dataset(eval_dataset, **fmt)
        from vfkit.parsers.parser import Parser
        from vfkit.rubrics.rubric import Rubric, share_parser

        parser_given, parser = parser is not None, parser if parser is not None else Parser()
        if rubric is None:
            rubric = Rubric(parser=parser)
        elif parser_given:
            share_parser(rubric, parser, env_id or type(self).__name__)
        self.parser, self.rubric = parser, rubric
        self.sampling_args = dict(sampling_args or {})
        self.max_seq_len = max_seq_len
        self.max_concurrent, self.max_concurrent_scoring = max_concurrent, max_concurrent_scoring
        self.timeout, self.max_retries = timeout, max_retries
        for key, value in kwargs.items():
            setattr(self, key, value)

    # ----- datasets -----
    def get_dataset(self, n: int = -1, seed: int | None = None) -> Dataset:
        """The training rows (shuffled with `seed` when given, first `n` when n >= 0)."""
        if self.dataset is None:
            raise ConfigError(f"environment {self.env_id or type(self).__name__} has no dataset; "
                              "pass dataset=... to its constructor")
        return select(self.dataset, n, seed)

    def get_eval_dataset(self, n: int = -1, seed: int | None = None) -> Dataset:
        """The eval rows; the training rows when the environment has no eval_dataset."""
        if self.eval_dataset is None:
            return self.get_dataset(n, seed)
        return select(self.eval_dataset, n, seed)

    def set_max_seq_len(self, max_seq_len: int | None) -> None:
        """Limit prompt + completion tokens per model call (the trainer's sequence length)."""
        self.max_seq_len = max_seq_len

    # ----- state -----
    def init_state(self, input: dict[str, Any]) -> State:
        """A fresh state for one rollout of `input` (a dataset row)."""
        row = input
        if row.get("prompt") is None:
            row = format_row(dict(input), int(input.get("example_id") or 0),
                             system_prompt=self.system_prompt, few_shot=self.few_shot,
                             message_type=self.message_type, task=self.env_id or "default")
        return new_state(row, self.env_id or "default")

    def error_state(self, input: dict[str, Any], error: BaseException) -> State:
        """The state of a rollout that raised before returning one (even from a bad input)."""
        return failed_state(self.init_state, input, error)

    # ----- rollouts -----
    async def rollout(
        self, input: dict[str, Any], client: AsyncOpenAI, model: str, sampling_args: SamplingArgs
    ) -> State:
        """Run one rollout of `input` and return its state (unscored). Subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement rollout()")

    def merge_sampling_args(self, sampling_args: SamplingArgs | None) -> SamplingArgs:
        """The environment's own sampling args under the caller's (client/sampling.py)."""
        return merge_sampling_args(self.sampling_args, sampling_args)

    def wrap_client(self, client: AsyncOpenAI, max_retries: int | None = None) -> AsyncOpenAI:
        """The client with this environment's per-request timeout and retry count."""
        if not hasattr(client, "with_options"):
            return client
        retries = self.max_retries if max_retries is None else max_retries
        return client.with_options(timeout=self.timeout, max_retries=retries)

    async def _rollout_safely(
        self, input: dict[str, Any], client: AsyncOpenAI, model: str, sampling_args: SamplingArgs,
        sem: asyncio.Semaphore | None = None,
    ) -> State:
        start = time.perf_counter()
        try:
            if sem is None:
                state = await self.rollout(input, client, model, sampling_args)
            else:
                async with sem:
                    state = await self.rollout(input, client, model, sampling_args)
            state = complete_state(state, input, self.init_state, type(self).__name__)
        except INTERRUPTS:
            raise
        except BaseException as e:  # a failed rollout is recorded, never fatal to its group
            logger.warning("rollout of example %s failed: %s", input.get("example_id"), e)
            state = self.error_state(input, e)
        state["timing"]["generation_ms"] = (time.perf_counter() - start) * 1000
        return state

    async def score_states(self, states: list[State], sem: asyncio.Semaphore | None = None) -> None:
        """Score a group with the rubric; failed rollouts get reward 0 and no advantage."""
        failed = [bool(s.get("error")) for s in states]
        start = time.perf_counter()
        try:
            if sem is None:
                await self.rubric.score_group(states)
            else:
                async with sem:
                    await self.rubric.score_group(states)
        except INTERRUPTS:
            raise
        except BaseException as e:  # a broken rubric must not kill the batch either
            for s in states:
                s["error"] = s.get("error") or f"scoring failed: {error_text(e)}"
                s["reward"] = 0.0
        scoring_ms = (time.perf_counter() - start) * 1000
        for s, was_failed in zip(states, failed, strict=True):
            s["metrics"] = s.get("metrics") or {}
            s["reward"] = 0.0 if was_failed or s.get("reward") is None else float(s["reward"])
            s["timing"]["scoring_ms"] = scoring_ms
            s["timing"]["total_ms"] = s["timing"]["generation_ms"] + scoring_ms
        set_group_advantages(states)

    async def run_rollout(
        self, input: dict[str, Any], client: AsyncOpenAI, model: str,
        sampling_args: SamplingArgs | None = None, *, score: bool = True, **kwargs: Any,
    ) -> State:
        """One rollout (errors recorded on the state), scored alone when `score`."""
        states = await self.run_group([input], client, model, sampling_args, score=score,
                                      **kwargs)
        return states[0]

    async def run_group(
        self, group_inputs: list[dict[str, Any]], client: AsyncOpenAI, model: str,
        sampling_args: SamplingArgs | None = None, *, score: bool = True,
        max_retries: int | None = None, gen_sem: asyncio.Semaphore | None = None,
        score_sem: asyncio.Semaphore | None = None, gen_sampling_args: SamplingArgs | None = None,
        state_columns: list[str] | None = None, env_client: Any = None,
        rollout_indices: Sequence[int] | None = None,
    ) -> list[State]:
        """Run a group's rollouts concurrently, then score them together (group-level rewards).

        `max_retries` overrides the environment's. A `seed` in the sampling args seeds the
        group: rollout k samples with seed + k, k from `rollout_indices` (default 0, 1, ...; a
        resumed eval runs only the missing ones). For other verifiers versions' callers:
        `client` may be ClientConfig-shaped, `gen_sampling_args` means `sampling_args`, each
        state records its `sampling_args` and has every `state_columns` key; `env_client` (a
        remote env server) must be None, as vfkit runs rollouts in this process.
        """
        if env_client is not None:
            raise ConfigError("run_group(env_client=...): vfkit runs rollouts in-process and "
                              "has no env-server mode; pass env_client=None")
        if gen_sem is None and self.max_concurrent > 0:
            gen_sem = asyncio.Semaphore(self.max_concurrent)
        sampling_args = sampling_args if sampling_args is not None else gen_sampling_args
        client = self.wrap_client(resolve_client(client), max_retries)
        args = self.merge_sampling_args(sampling_args)
        per_rollout = seed_rollouts(args, len(group_inputs), rollout_indices)
        states = list(await asyncio.gather(*(
            self._rollout_safely(inp, client, model, rollout_args, gen_sem)
            for inp, rollout_args in zip(group_inputs, per_rollout, strict=True)
        )))
        if score:
            await self.score_states(states, score_sem)
        for state, rollout_args in zip(states, per_rollout, strict=True):
            state["sampling_args"] = copy.deepcopy(rollout_args)
            for column in state_columns or ():
                state.setdefault(column, None)
        return states

    async def generate(
        self, inputs: Dataset | Sequence[dict[str, Any]], client: AsyncOpenAI, model: str,
        sampling_args: SamplingArgs | None = None, *, rollouts_per_example: int = 1,
        max_concurrent: int = -1, max_concurrent_scoring: int = -1, on_group: OnGroup | None = None,
        state_columns: list[str] | None = None,
        rollout_indices: Mapping[Any, Sequence[int]] | None = None, score: bool = True,
    ) -> GenerateOutputs:
        """Run `rollouts_per_example` rollouts per input as groups; states in input order.

        At most `max_concurrent` rollouts generate and `max_concurrent_scoring` groups score at
        once (<= 0: the environment's defaults; unbounded when those are <= 0 too). `on_group`
        (sync or async) gets each group's states as soon as that group is scored. A `seed` in
        the sampling args seeds each group by its example_id (client/sampling.py).
        `rollout_indices`: example_id -> which rollouts of its group to run (`run_group`'s),
        for a resumed eval that runs only the missing ones. `score=False`: no rubric (reward
        and advantage stay None).
        """
        rows = [dict(r) for r in inputs]
        per_group = seed_groups(self.merge_sampling_args(sampling_args), rows)
        gen_n = max_concurrent if max_concurrent > 0 else self.max_concurrent
        score_n = max_concurrent_scoring if max_concurrent_scoring > 0 else (
            self.max_concurrent_scoring)
        gen_sem = asyncio.Semaphore(gen_n) if gen_n > 0 else None
        score_sem = asyncio.Semaphore(score_n) if score_n > 0 else None

        async def one_group(row: dict[str, Any], group_args: SamplingArgs) -> list[State]:
            group = [dict(row) for _ in range(rollouts_per_example)]
            indices = (rollout_indices or {}).get(row.get("example_id"))
            states = await self.run_group(group, client, model, group_args, gen_sem=gen_sem,
                                          score_sem=score_sem, state_columns=state_columns,
                                          rollout_indices=indices, score=score)
            if on_group is not None:
                await maybe_await(on_group(states))
            return states

        tasks = [asyncio.ensure_future(one_group(row, args))
                 for row, args in zip(rows, per_group, strict=True)]
        try:
            groups = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        return GenerateOutputs(states=[s for g in groups for s in g])

    def _get_eval_inputs(self, num_examples: int = -1,
                         rollouts_per_example: int = 1) -> list[dict[str, Any]]:
        """The eval rows, the whole list repeated `rollouts_per_example` times (2026-02 contract;
        callers that group by example_id, prime-rl and classic generate, regroup them)."""
        rows = [dict(row) for row in self.get_eval_dataset(n=num_examples)]
        return [dict(row) for _ in range(max(1, rollouts_per_example)) for row in rows]

    async def a_evaluate(
        self, client: AsyncOpenAI, model: str, sampling_args: SamplingArgs | None = None,
        num_examples: int = -1, rollouts_per_example: int = 1, max_concurrent: int = -1,
        max_concurrent_scoring: int = -1, seed: int | None = None,
        on_group: OnGroup | None = None, state_columns: list[str] | None = None,
        score_rollouts: bool = True, **classic: Any,
    ) -> GenerateOutputs:
        """Roll out and score the eval dataset's first `num_examples` rows (all when -1).

        `state_columns` and `score_rollouts` (False: unscored) are generate's; of classic
        verifiers' other keywords, `max_concurrent_generation` means `max_concurrent`, and its
        saving options (save_results=True, results_path, ...) are ConfigErrors: vf-eval saves.
        """
        max_concurrent = classic_max_concurrent(classic, max_concurrent)
        dataset = self.get_eval_dataset(n=num_examples, seed=seed)
        return await self.generate(
            dataset, client, model, sampling_args, rollouts_per_example=rollouts_per_example,
            max_concurrent=max_concurrent, max_concurrent_scoring=max_concurrent_scoring,
            on_group=on_group, state_columns=state_columns, score=score_rollouts,
        )

    def evaluate(
        self, client: AsyncOpenAI, model: str, *args: Any, **kwargs: Any
    ) -> GenerateOutputs:
        """Blocking a_evaluate (runs its own event loop; in a worker thread if one is running).

        The client's requests go through a connection pool opened for this call (async_utils.
        own_connections), so the same client works again in the next blocking call.
        """

        async def run() -> GenerateOutputs:
            async with own_connections(client) as own:
                return await self.a_evaluate(own, model, *args, **kwargs)

        return run_sync(run())


CLASSIC_SAVING = ("save_results", "results_path", "push_to_hub", "hub_name")


def classic_max_concurrent(classic: dict[str, Any], max_concurrent: int) -> int:
    """`max_concurrent`, or classic verifiers' `max_concurrent_generation` for it; its saving
    options are ConfigErrors (a false or None value asks for nothing and passes)."""
    saving = [key for key in CLASSIC_SAVING if classic.get(key)]
    if saving:
        raise ConfigError(
            f"evaluate({saving[0]}=...): vfkit's evaluate() returns the rollouts and saves "
            "nothing; run `vf-eval <env> -m <model>` (it writes outputs/evals/<env>--<model>/"
            "<id>/results.jsonl), or save out.states yourself"
        )
    unknown = sorted(set(classic) - {"max_concurrent_generation", *CLASSIC_SAVING})
    if unknown:
        raise TypeError(f"evaluate() got unexpected keyword argument(s) {unknown}")
    generation = classic.get("max_concurrent_generation")
    if generation is None:
        return max_concurrent
    if max_concurrent > 0 and generation != max_concurrent:
        raise ConfigError(f"evaluate(): max_concurrent={max_concurrent} and "
                          f"max_concurrent_generation={generation} disagree; give one of them")
    return int(generation)
