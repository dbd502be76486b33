"""The live batch source: rollouts sampled in their own thread and event loop, ahead of training.

The orchestrator owns the policy versions: version v is the adapter after v optimizer steps
(0 = the base model). Batch s is sampled by the newest published version the lag allows
(s - 1 - async_level), one batch after another in submission order. `publish` hot-loads a new
version and verifies that the server serves exactly the trained weights before any batch uses it.

    with Orchestrator(env, rows, base_url=url, args=cfg.trainer.args, run=run) as orch:
        orch.submit(1)
        batch = orch.get(1)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import shutil
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from vfkit.client.sampling import derive_seed, with_seed
from vfkit.errors import AdapterSyncError, VfkitError
from vfkit.lora_fingerprint import fingerprint_dir
from vfkit.rubrics.call import running_functions
from vfkit.train.adapter_sync import AdapterSync, check_fingerprint, check_probe
from vfkit.train.advantages import group_verdict
from vfkit.train.batches import Batch
from vfkit.train.config import TrainerArgs
from vfkit.train.data import DataOrder, write_rollouts
from vfkit.train.metrics import reward_metrics
from vfkit.train.rundir import RunDir
from vfkit.types import SamplingArgs, State

T = TypeVar("T")
logger = logging.getLogger(__name__)
PROBE_RECHECKS = 3  # a doubtful probe is re-checked this often before the run stops


def retries_within(seconds: float) -> int:
    """Retries the openai client's backoff (0.5 s, doubling, at most 8 s a wait) spreads over
    `seconds`: rollouts ride out a server blip (5xx, 429, a dropped connection) as long as
    adapter loading does (`sync_timeout`), instead of failing a whole batch in ~4 s."""
    waited, retries = 0.0, 0
    while waited < seconds:
        waited += min(0.5 * 2**retries, 8.0)
        retries += 1
    return retries


class Orchestrator:
    """Owns the HTTP client, the rollout event loop and the adapters loaded in the server."""

    def __init__(
        self,
        env: Any,
        rows: list[dict],
        *,
        base_url: str,
        args: TrainerArgs,
        run: RunDir,
        sampling_args: SamplingArgs | None = None,
        api_key: str = "",
        eval_env: Any = None,
        eval_rows: list[dict] | None = None,
        eval_sampling_args: SamplingArgs | None = None,
        policies: dict[int, Path] | None = None,
        server_failure: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.env, self.rows, self.args, self.run = env, rows, args, run
        self.eval_env, self.eval_rows = eval_env or env, eval_rows or []
        # None: the run's own layering (defaults < the env's sampling_args < the config's keys)
        self.sampling_args = _or_layered(sampling_args, args, env)
        self.eval_sampling_args = _or_layered(eval_sampling_args, args, self.eval_env)
        self.base_url, self.api_key = base_url, api_key
        self.server_failure = server_failure  # why the server is gone for good (None: it is not)
        self.resume_policies = dict(policies or {})  # from a checkpoint: version -> folder
        self.order = DataOrder(len(rows), args.prompts_per_batch, args.seed)
        self.loaded: dict[int, str] = {}  # policy version -> served model name (0 = base)
        self.pending: dict[int, tuple[int, concurrent.futures.Future]] = {}  # step -> (v, fut)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollouts", daemon=True)
        self._previous: asyncio.Future | None = None

    # --- lifecycle
    def __enter__(self) -> Orchestrator:
        self._thread.start()
        self._call(self._setup())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _setup(self) -> None:
        self.sync = AdapterSync(self.base_url, self.api_key, timeout=self.args.sync_timeout)
        # a 404 for one of our adapters (the server restarted and lost it) re-loads it
        # each call's timeout is the env's (`timeout`); its retries are `self.retries`; the
        # whole batch is bounded by generation_timeout (get)
        self.client = AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key or "EMPTY",
            http_client=DefaultAsyncHttpxClient(transport=self.sync.transport()),
        )
        self.retries = retries_within(self.args.sync_timeout)
        served = await self.sync.served_models()  # the base model: the entry not an adapter
        self.loaded[0] = ([m["id"] for m in served if not m.get("parent")] or [served[0]["id"]])[0]
        # max_concurrent counts rollouts; groups run whole, so it rounds down to groups (min 1)
        slots = max(1, self.args.max_concurrent // self.args.rollouts_per_example)
        self.group_slots = asyncio.Semaphore(slots if self.args.max_concurrent > 0 else 10**6)

    def close(self) -> None:
        """Cancel what is still generating and stop the loop thread."""
        if not self._thread.is_alive():
            return
        for _, fut in self.pending.values():
            fut.cancel()

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.sync.aclose()
            await self.client.close()

        try:
            self._call(shutdown(), timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the rollout loop and wait for its result here."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- the BatchSource protocol (batches.py)
    def start(self, step: int) -> dict[str, float]:
        """Re-load a resumed run's policies, queue the first batches, eval a fresh run."""
        for version, folder in sorted(self.resume_policies.items()):
            if version >= self.policy_for(step + 1):
                self._load_verified(version, folder, learner=None)
        for s in range(step + 1, step + 1 + self.args.async_level):
            self.submit(s)
        return self.evaluate(0) if self.args.eval_steps and step == 0 else {}

    def policy_for(self, step: int) -> int:
        """The policy version the lag allows for batch `step`: the adapter of step-1-lag."""
        return max(0, step - 1 - self.args.async_level)

    def submit(self, step: int) -> None:
        """Queue batch `step`, sampled by the newest loaded policy the lag allows."""
        if step > self.args.max_steps or step in self.pending:
            return
        version = max(v for v in self.loaded if v <= self.policy_for(step))
        coro = self._generate_after_previous(step, version)
        self.pending[step] = (version, asyncio.run_coroutine_threadsafe(coro, self._loop))

    def get(self, step: int, should_stop: Callable[[], bool] = lambda: False) -> Batch | None:
        """Wait for batch `step`; None if `should_stop()` turns true first. Errors re-raise here."""
        _, fut = self.pending[step]
        started = time.monotonic()
        while True:
            try:
                batch = fut.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                if should_stop():
                    return None
                if failure := self.server_failure():
                    raise VfkitError(f"{failure}; the run stops here (--resume continues from "
                                     "the last checkpoint)") from None
                if not self._thread.is_alive():
                    raise VfkitError("the rollout thread died; see the log above") from None
                continue
            del self.pending[step]
            batch.wait_s = time.monotonic() - started
            return batch

    def generating(self) -> bool:
        """True while a queued batch is still being sampled."""
        return any(not fut.done() for _, fut in list(self.pending.values()))

    def publish(self, version: int, adapter_dir: Path, learner: Any) -> dict[str, float]:
        """Hot-load policy `version`, verify it, unload and delete adapters nothing uses."""
        started = time.monotonic()
        metrics = self._load_verified(version, adapter_dir, learner)
        in_use = {v for v, _ in self.pending.values()} | self._needed_after(version) | {version, 0}
        for stale in [v for v in self.loaded if v not in in_use]:
            self._call(self.sync.unload(self.loaded.pop(stale)))
            shutil.rmtree(self.run.adapter_dir(stale), ignore_errors=True)
        return {**metrics, "time/sync": time.monotonic() - started}

    def finish(self, batch: Batch, *, evaluate: bool) -> dict[str, float]:
        """Write rollouts/step_N.jsonl; evaluate the newest policy when asked."""
        write_rollouts(self.run.rollouts_file(batch.step), batch.groups, batch.policy_version)
        return self.evaluate(max(self.loaded), batch.step) if evaluate else {}

    def policies_in_use(self, step: int) -> dict[int, Path]:
        """The older adapters a checkpoint after `step` keeps: those queued batches sample from,
        and those the next batches would (at the last step too: a run resumed with more
        max_steps samples its next batch with them, not with the base model)."""
        wanted = {v for v, _ in self.pending.values()} | self._needed_after(step)
        return {v: self.run.adapter_dir(v) for v in sorted(wanted) if 0 < v < step}

    def _needed_after(self, step: int) -> set[int]:
        """Policy versions the `async_level` batches after `step` sample from."""
        return {self.policy_for(s) for s in range(step + 1, step + 1 + self.args.async_level)}

    # --- rollouts
    async def _generate_after_previous(self, step: int, version: int) -> Batch:
        previous, self._previous = self._previous, asyncio.current_task()
        if previous is not None:  # one batch at a time, in submission order
            await asyncio.wait([previous])
        started = time.monotonic()
        try:
            groups = await asyncio.wait_for(
                self._generate(step, self.loaded[version]), self.args.generation_timeout
            )
        except TimeoutError:
            running = running_functions()
            waiting = (f"; still running: reward function(s) {', '.join(running)}, which may "
                       "never return" if running else f" (server {self.base_url})")
            raise VfkitError(
                f"generating and scoring batch {step} took over "
                f"{self.args.generation_timeout:.0f} s{waiting}; raise "
                "trainer.args.generation_timeout or lower batch_size / max_tokens"
            ) from None
        return Batch(step, version, groups, time.monotonic() - started)

    async def _generate(self, step: int, model: str) -> list[list[State]]:
        """The step's groups; with dynamic sampling, then the groups that replaced flat ones
        (all are kept: the trainer filters the flat ones, the rollouts file shows them)."""

        async def group(row: dict, *where: int | str) -> list[State]:
            inputs = [dict(row) for _ in range(self.args.rollouts_per_example)]
            async with self.group_slots:
                return await self.env.run_group(
                    inputs, self.client, model, self.seeded(self.sampling_args, *where),
                    max_retries=self.retries)

        async def sample(indices: list[int], *where: int | str) -> list[list[State]]:
            return list(await asyncio.gather(
                *(group(self.rows[i], *where, g) for g, i in enumerate(indices))))

        taken = self.order.indices(step)
        groups = newest = await sample(taken, "step", step)
        for round_ in range(1, self.args.dynamic_sampling_rounds + 1):
            flat = sum(self._verdict(g) == "flat" for g in newest)
            if not flat:
                break
            fresh = self.order.refill(step, round_, flat, set(taken))
            newest = await sample(fresh, "refill", step, round_)
            groups, taken = groups + newest, taken + fresh
        return groups

    def _verdict(self, group: list[State]) -> str:
        a = self.args
        return group_verdict(
            group, scale_rewards=a.scale_rewards, zero_truncated=a.zero_truncated_completions)

    def seeded(self, args: SamplingArgs, *where: int | str) -> SamplingArgs:
        """`args` with the seed of one group of the run: a function of (seed, where) alone, so
        a rerun, or a resumed run, sends the server the same seeds (rollout k of the group
        adds k: client/sampling.py)."""
        return with_seed(args, derive_seed(self.args.seed, *where))

    # --- policies
    def _load_verified(self, version: int, adapter_dir: Path, learner: Any) -> dict[str, float]:
        """Load an adapter as policy `version`; prove it is the trained one (metrics say how).

        With a server that reports fingerprints the check is exact (one re-load on a mismatch).
        Otherwise a probe completion's logprobs are compared with the trainer's, and a doubt
        is re-checked with fresh probes before it may stop the run.
        """
        name, trained = self.run.adapter_name(version), fingerprint_dir(adapter_dir)
        card = self._timed_load(name, adapter_dir)
        if card.get("fingerprint") is not None:
            if card["fingerprint"] != trained:
                logger.warning("adapter %s: fingerprint differs after load; loading again", name)
                card = self._timed_load(name, adapter_dir)
            check_fingerprint(name, str(card.get("fingerprint")), trained)
            self.loaded[version] = name
            return {"sync/fingerprint_ok": 1.0}
        self.loaded[version] = name
        if learner is None or not self.args.probe_enabled:
            return {}
        return {"sync/probe_diff": self._probe_check(name, learner)}

    def _probe_check(self, name: str, learner: Any) -> float:
        tolerance = self.args.adapter_probe_tolerance
        for attempt in range(PROBE_RECHECKS):
            probe = self._call(self.sync.probe(name, seed=attempt))
            try:
                return check_probe(name, probe, learner.probe_logprobs(probe), tolerance)
            except AdapterSyncError as doubt:
                if attempt == PROBE_RECHECKS - 1:
                    raise
                logger.warning("%s; checking again with a fresh probe", doubt)
        raise AssertionError("unreachable")

    def _timed_load(self, name: str, adapter_dir: Path) -> dict:
        # load and probe each retry an unreachable server for up to sync_timeout themselves
        limit = 2 * self.args.sync_timeout + 5
        try:
            return self._call(asyncio.wait_for(self.sync.load(name, adapter_dir), limit))
        except TimeoutError:
            raise AdapterSyncError(
                f"loading adapter {name} took over {limit:.0f} s;"
                " raise trainer.args.sync_timeout or check the server log"
            ) from None

    # --- evaluation
    def evaluate(self, version: int, step: int = 0) -> dict[str, float]:
        """eval/reward/mean, eval/reward/<fn>, eval/errors on the held-out rows (one rollout
        each, scored by the eval env's rubric); the rollouts go to rollouts/eval_step_N.jsonl."""
        started = time.monotonic()
        model = self.loaded[version]

        async def run() -> list[State]:
            async def one(index: int, row: dict) -> State:
                # the same seeds at every eval: steps differ by their policy, not their draws
                args = self.seeded(self.eval_sampling_args, "eval", index)
                async with self.group_slots:
                    return await self.eval_env.run_rollout(
                        dict(row), self.client, model, args, max_retries=self.retries)

            return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(self.eval_rows))))

        states = self._call(run())
        write_rollouts(self.run.eval_rollouts_file(step), [[s] for s in states], version)
        return {**reward_metrics(states, prefix="eval/"), "time/eval": time.monotonic() - started}


def _or_layered(given: SamplingArgs | None, args: TrainerArgs, env: Any) -> SamplingArgs:
    return args.rollout_sampling_args(env.sampling_args) if given is None else given
