"""One vf-eval run: load the environment, pick the endpoint, run the groups, save and summarize.

The rollouts themselves are the environment's (`env.generate` with an `on_group` callback); this
module decides which (example, rollout index) pairs still need running, writes each finished
group as it lands, and keeps metadata.json up to date, so an interrupted run can be resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

import vfkit
from vfkit.client.sampling import drop_sampling_keys
from vfkit.errors import ConfigError, VfkitError
from vfkit.evaluation.config import (
    DEFAULT_MODEL,
    DEFAULT_NUM_EXAMPLES,
    DEFAULT_ROLLOUTS_PER_EXAMPLE,
    EvalConfig,
)
from vfkit.evaluation.defaults import eval_defaults
from vfkit.evaluation.display import EvalProgress, print_summary
from vfkit.evaluation.failures import FailureTally, ServerStoppedAnswering
from vfkit.evaluation.recorder import RunRecorder
from vfkit.evaluation.results import (
    RESULTS_FILE,
    ResultsWriteError,
    check_state_columns,
    check_writable_folder,
    completed_rollouts,
    load_results,
    read_metadata,
)
from vfkit.evaluation.resume import apply_resumed_settings, check_resumed_examples
from vfkit.evaluation.target import Target, open_target
from vfkit.evaluation.urls import redact_url
from vfkit.runlock import RunLock

log = logging.getLogger(__name__)


def model_folder_name(model: str) -> str:
    """`org/name` -> `org--name`; a local folder path -> its last component."""
    path = Path(model).expanduser()
    if path.is_absolute() or model.startswith((".", "~")) or path.is_dir():
        return path.resolve().name
    return model.replace("/", "--")


def new_run_dir(output_dir: Path, env_id: str, model: str) -> Path:
    """outputs/evals/<env>--<model>/<run id>, the run id sortable by time."""
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    return output_dir / f"{env_id}--{model_folder_name(model)}" / run_id


def plan_groups(dataset: Any, r: int, done: dict[int, set[int]]) -> dict[int, list[int]]:
    """example_id -> rollout indices still to run (all of 0..r-1 minus those already saved)."""
    todo: dict[int, list[int]] = {}
    for i, row in enumerate(dataset):
        example_id = row.get("example_id", i)
        missing = [k for k in range(r) if k not in done.get(example_id, set())]
        if missing:
            todo[example_id] = missing
    return todo


async def _generate(
    env: Any,
    inputs: list[dict[str, Any]],
    todo: dict[int, list[int]],
    target: Target,
    cfg: EvalConfig,
    on_group: Any,
) -> None:
    """Run the missing rollouts; groups of equal size go through one `env.generate` call."""
    from openai import AsyncOpenAI

    by_size: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for i, row in enumerate(inputs):
        missing = todo.get(row.get("example_id", i))
        if missing:
            by_size[len(missing)].append(row)
    # closed inside the event loop: closing it after the loop ends prints a spurious traceback
    async with AsyncOpenAI(
        base_url=target.base_url,
        api_key=target.api_key,
        default_headers=target.headers or None,
        timeout=cfg.timeout,
        max_retries=cfg.max_retries,
    ) as client:
        for size, rows in sorted(by_size.items()):  # partial groups (after a torn write): few
            await env.generate(
                rows,
                client,
                target.model,
                dict(cfg.sampling_args),
                rollouts_per_example=size,
                max_concurrent=cfg.max_concurrent,
                on_group=on_group,
                rollout_indices=todo,  # a partial group's rollouts keep their own seeds
            )


def build_metadata(cfg: EvalConfig, env: Any, target: Target, run_id: str, n: int, r: int) -> dict:
    """The fixed part of metadata.json: what ran, against what, with which settings.

    `sampling_args` are the flags' (what --resume pins); `sampling_args_sent`, what requests
    carry: the environment's own under the flags (before per-rollout seeds, the token-id and
    logprob switches, and a max_tokens cut to fit the context)."""
    now = datetime.now()
    return {
        "env_id": cfg.env_id,
        "env_args": cfg.env_args or {},
        "model": cfg.model,
        "served_model": target.model,
        "base_url": redact_url(target.base_url),  # a password in -b is never written down
        "endpoint_source": target.source,
        # so that --resume finds a registry entry without -e (absolute: any working folder)
        "endpoints_path": str(target.registry_path.resolve()) if target.registry_path else None,
        "num_examples": n,
        "rollouts_per_example": r,
        "sampling_args": cfg.sampling_args,
        "sampling_args_sent": env.merge_sampling_args(cfg.sampling_args),
        "max_concurrent": cfg.max_concurrent,
        "state_columns": cfg.state_columns,
        "run_id": run_id,
        "date": now.strftime("%Y-%m-%d"),
        "time": now.strftime("%H:%M:%S"),
        "vfkit_version": vfkit.__version__,
    }


def _load(cfg: EvalConfig) -> tuple[Any, list[dict[str, Any]], int]:
    """The environment, its eval rows and the rollouts per example (flag > pyproject > default)."""
    if not cfg.env_id:
        raise ConfigError("give an environment id: vf-eval ENV_ID -m MODEL (see --help)")
    from vfkit.envs.registry import load_environment

    try:
        env = load_environment(cfg.env_id, **(cfg.env_args or {}))
    except VfkitError:
        raise
    except Exception as exc:  # the environment's own code refused what -a gave it
        if not cfg.env_args:
            raise  # a bug in the environment itself: its traceback is what its author needs
        raise ConfigError(
            f"-a/--env-args: load_environment({cfg.env_id!r}, **{json.dumps(cfg.env_args)}) "
            f"failed: {type(exc).__name__}: {exc}; pass only the arguments it declares, with "
            "the types it expects"
        ) from None
    # the environment wraps the client with its own timeout/retries: make those the flags'
    env.timeout, env.max_retries = cfg.timeout, cfg.max_retries
    unset_sampling_keys(env, cfg.sampling_args)
    defaults = {
        "num_examples": DEFAULT_NUM_EXAMPLES,
        "rollouts_per_example": DEFAULT_ROLLOUTS_PER_EXAMPLE,
        **eval_defaults(cfg.env_id),
    }
    n = cfg.num_examples or defaults["num_examples"]
    r = cfg.rollouts_per_example or defaults["rollouts_per_example"]
    inputs = [dict(row) for row in env.get_eval_dataset(n=n)]
    for i, row in enumerate(inputs):
        row.setdefault("example_id", i)
    return env, inputs, r


def unset_sampling_keys(env: Any, args: dict[str, Any]) -> None:
    """A null in -S unsets that key: the environment's own value is dropped, so the request
    goes without it (`-S '{"max_tokens": null}'`: no limit but the server's)."""
    extra = args.get("extra_body") if isinstance(args.get("extra_body"), dict) else {}
    unset = [k for k, v in (*args.items(), *extra.items()) if v is None]
    if unset:
        env.sampling_args = drop_sampling_keys(env.sampling_args, unset)


def _reward_names(env: Any) -> list[str]:
    rubric = getattr(env, "rubric", None)
    get_names = getattr(rubric, "get_reward_func_names", None)
    return list(get_names()) if get_names else []


def _run(
    env: Any,
    inputs: list[dict[str, Any]],
    todo: dict[int, list[int]],
    target: Target,
    cfg: EvalConfig,
    recorder: RunRecorder,
    console: Console,
) -> None:
    """Generate the missing rollouts with a live display; metadata says how it ended."""
    recorder.failures = FailureTally(redact_url(target.base_url))
    total = len(recorder.rows) + sum(map(len, todo.values()))  # saved + still to run
    meta = recorder.meta
    try:  # from the first "running" on: a Ctrl-C at any point leaves "interrupted" behind
        recorder.save_metadata("running")
        console.print(
            f"{meta['env_id']}: {meta['num_examples']} examples x {meta['rollouts_per_example']} "
            f"rollouts, model {meta['model']} at {meta['base_url']}",
            markup=False,
            soft_wrap=True,
        )
        with EvalProgress(console, total, len(recorder.rows)) as recorder.progress:
            asyncio.run(_generate(env, inputs, todo, target, cfg, recorder.on_group))
    except BaseException as exc:
        # rows are missing (no answer, or not written): --resume runs them; else interrupted
        stopped = isinstance(exc, ServerStoppedAnswering | ResultsWriteError)
        _finish(recorder, "incomplete" if stopped else "interrupted", console, unwinding=True)
        raise
    _finish(recorder, recorder.final_status(), console, unwinding=False)


def _finish(recorder: RunRecorder, status: str, console: Console, *, unwinding: bool) -> None:
    """Write the final metadata.json. While another error unwinds, a failure to write it is
    only printed: the first error (and its advice) is the one the user must see."""
    try:
        recorder.save_metadata(status)
    except ResultsWriteError as exc:
        if not unwinding:
            raise
        console.print(f"metadata.json was not updated either: {exc}", markup=False)
    if status not in ("completed", "failed") and recorder.run_dir is not None:
        console.print(f"Stopped early: continue with --resume {recorder.run_dir}", markup=False)


def _run_missing(
    cfg: EvalConfig,
    env: Any,
    inputs: list[dict[str, Any]],
    r: int,
    run_dir: Path | None,
    recorder: RunRecorder,
    locks: contextlib.ExitStack,
    console: Console,
) -> Path | None:
    """Open the target, then the run folder (locked), and run what `recorder.todo` lists."""
    server_log = run_dir / "server.log" if run_dir is not None else None  # None: temp file
    with open_target(cfg, console, server_log) as target:
        cfg.model = cfg.model or target.model
        if cfg.save_results and run_dir is None:
            run_dir = new_run_dir(cfg.output_dir, cfg.env_id or "", cfg.model)
        if run_dir is not None:
            if not cfg.resume:  # a resumed run was locked before its results were read
                locks.enter_context(RunLock(run_dir))
            console.print(f"Run folder: {run_dir}", markup=False, soft_wrap=True)
            recorder.open(run_dir)
        run_id = run_dir.name if run_dir is not None else uuid.uuid4().hex[:6]
        recorder.meta = build_metadata(cfg, env, target, run_id, len(inputs), r)
        if cfg.resume and run_dir is not None:  # keep when the run first started
            first = read_metadata(run_dir)
            recorder.meta.update(date=first.get("date"), time=first.get("time"),
                                 resumed_at=datetime.now().isoformat(timespec="seconds"))
        _run(env, inputs, recorder.todo, target, cfg, recorder, console)
    return run_dir


def run_eval(cfg: EvalConfig, console: Console | None = None) -> Path | None:
    """Run the evaluation `cfg` describes; returns the run folder (None when not saving).

    Raises IncompleteEvalError (after the summary) when rollouts are missing or none scored.
    """
    console = console or Console(stderr=True)
    with contextlib.ExitStack() as locks:
        run_dir = None
        if cfg.resume:
            run_dir = apply_resumed_settings(cfg)
            locks.enter_context(RunLock(run_dir))  # a second --resume of this run stops here
        env, inputs, r = _load(cfg)
        if run_dir is not None:
            check_resumed_examples(run_dir, len(inputs), cfg.num_examples)
        if cfg.save_results:  # a bad -o is refused before a server is started or contacted
            check_writable_folder(run_dir or cfg.output_dir,
                                  "--resume" if run_dir else "-o/--output-dir")
        if cfg.api_base_url is None:  # with -b and no -m, the server says which model it serves
            cfg.model = cfg.model or DEFAULT_MODEL
        if cfg.save_results and run_dir is None and cfg.model:
            run_dir = new_run_dir(cfg.output_dir, cfg.env_id or "", cfg.model)
        prior = load_results(run_dir / RESULTS_FILE, repair=True) if cfg.resume and run_dir else []
        todo = plan_groups(inputs, r, completed_rollouts(prior))
        check_state_columns(cfg.state_columns, _reward_names(env))  # a reward's column too
        recorder = RunRecorder(cfg, todo, prior, _reward_names(env), expected=len(inputs) * r)
        try:
            if todo:
                run_dir = _run_missing(cfg, env, inputs, r, run_dir, recorder, locks, console)
            else:
                console.print("Nothing left to run: every rollout is already in the results.")
        except (ServerStoppedAnswering, ResultsWriteError):
            _summarize(recorder, r, recorder.run_dir or run_dir, cfg)  # what was saved
            raise
    _summarize(recorder, r, run_dir, cfg)
    recorder.raise_unless_usable()  # errors are not results: missing or unscored runs fail
    return run_dir


def _summarize(recorder: RunRecorder, r: int, run_dir: Path | None, cfg: EvalConfig) -> None:
    """The summary of every saved row (this session's and a resumed run's) on stdout."""
    print_summary(
        Console(),
        recorder.summary(),
        recorder.rows,
        rollouts_per_example=r,
        seed=str(run_dir or cfg.env_id),
        run_dir=run_dir,
        no_answer=recorder.failures.count,
    )
