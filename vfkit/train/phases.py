"""What `vf-train` runs: a whole training run, or one of its two halves.

    vf-train cfg.toml                   # sample and train, one step off-policy (loop.py)
    vf-train cfg.toml --phase rollout   # sample max_steps batches with the base model -> rollouts/
    vf-train cfg.toml --phase update    # train off-line from rollouts/step_N.jsonl (no server)

Each is resumable with --resume: training and update from the latest checkpoint, rollout after
the last complete rollouts file. This module wires the parts together; the algorithm is loop.py.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from accelerate import PartialState

from vfkit.errors import VfkitError
from vfkit.runlock import RunLock
from vfkit.train.batches import SavedBatches
from vfkit.train.checkpoint import find_checkpoint, policy_dirs
from vfkit.train.config import RunConfig
from vfkit.train.data import dataset_rows
from vfkit.train.learner import Learner
from vfkit.train.loop import LoopState, StopFlag, run_loop
from vfkit.train.metrics import MetricsLogger, rollout_metrics
from vfkit.train.orchestrator import Orchestrator
from vfkit.train.placement import check_one_gpu_per_rank, inference_server, trainer_on_cpu
from vfkit.train.policy import resolve_model_dir
from vfkit.train.resume import require_resumable
from vfkit.train.rundir import RunDir, open_run_dir, run_dir_of
from vfkit.train.vision import allowed_media_dirs, load_processor
from vfkit.types import SamplingArgs


def train(
    cfg: RunConfig, *, resume: str | bool | None = None, stop: StopFlag | None = None,
    saved_batches: bool = False,
) -> Path:
    """Run (or resume) training; return the run directory. `resume`: True = latest, or a path.

    `saved_batches`: train on the rollouts files of an earlier `--phase rollout`, no server.
    """
    # the same process group the Learner's Accelerator joins (cpu= as there, or CPU ranks
    # would each think they are alone); the main process alone writes, holding the run's lock
    check_one_gpu_per_rank(trainer_on_cpu(cfg))
    main = PartialState(cpu=trainer_on_cpu(cfg)).is_main_process
    with RunLock(run_dir_of(cfg).root) if main else contextlib.nullcontext():
        return _train(cfg, resume, stop or StopFlag(), saved_batches, main)


def _train(
    cfg: RunConfig, resume: str | bool | None, stop: StopFlag, saved_batches: bool, main: bool
) -> Path:
    if main and resume:  # before open_run_dir rewrites config.toml, the record of the run
        require_resumable(cfg, resume if isinstance(resume, str) else None)
    run = open_run_dir(cfg, resume=bool(resume)) if main else run_dir_of(cfg)
    env, eval_env = load_envs(cfg)
    cfg, sampling = with_rollout_sampling(cfg, env)
    a, learner = cfg.trainer.args, Learner(cfg, run)
    state, policies = LoopState(), {}
    if resume:
        ckpt = find_checkpoint(run, resume if isinstance(resume, str) else None)
        state.step = state.saved = learner.load_checkpoint(ckpt)["policy_version"]
        policies = policy_dirs(ckpt)
        if state.step >= a.max_steps and learner.is_main:
            print(f"vf-train: nothing to train: {ckpt} is at step {state.step} and "
                  f"trainer.args.max_steps is {a.max_steps}; raise max_steps to train on",
                  file=sys.stderr, flush=True)
    if not learner.is_main:  # only the main process samples; the others train on its samples
        learner.follow()
        return run.root
    log = metrics_logger(cfg, run)
    log.truncate(state.step)
    try:
        if saved_batches:
            run_loop(SavedBatches(run, a.max_steps), learner, log, a, state, stop)
        else:
            rows = dataset_rows(env.get_dataset(), learner.processor, a.max_prompt_len,
                                allowed_media_dirs(cfg))[0]
            with (
                inference_server(cfg, resolve_model_dir(cfg.model), run) as server,
                Orchestrator(
                    env, rows, base_url=server.base_url, server_failure=server.failure,
                    args=a, run=run, sampling_args=sampling,
                    api_key=cfg.inference.api_key, policies=policies, **eval_setup(
                        cfg, eval_env, learner.processor),
                ) as orch,
            ):
                run_loop(orch, learner, log, a, state, stop)
    finally:
        learner.release_followers()
        log.close()
    return run.root


def collect_rollouts(cfg: RunConfig, *, resume: bool = False, stop: StopFlag | None = None) -> Path:
    """Sample batches 1..max_steps with the base model into rollouts/step_N.jsonl."""
    with RunLock(run_dir_of(cfg).root):
        return _collect_rollouts(cfg, resume, stop or StopFlag())


def _collect_rollouts(cfg: RunConfig, resume: bool, stop: StopFlag) -> Path:
    a, run = cfg.trainer.args, open_run_dir(cfg, resume=resume)
    done = 0
    while run.rollouts_file(done + 1).exists():
        done += 1
    if done and not resume:
        raise VfkitError(f"{run.rollouts} already has {done} steps: add --resume to continue")
    model_dir = resolve_model_dir(cfg.model)
    env, rows, _, _ = load_data(cfg, load_processor(model_dir))
    cfg, sampling = with_rollout_sampling(cfg, env)
    log = metrics_logger(cfg, run)
    log.truncate(done)
    with (
        inference_server(cfg, model_dir, run) as server,
        Orchestrator(env, rows, base_url=server.base_url, server_failure=server.failure,
                     args=a, run=run, sampling_args=sampling,
                     api_key=cfg.inference.api_key) as orch,
    ):
        for step in range(done + 1, done + 1 + a.async_level):
            orch.submit(step)
        for step in range(done + 1, a.max_steps + 1):
            orch.submit(step + a.async_level)  # every batch from the base model (version 0)
            batch = orch.get(step, stop)
            if batch is None:
                break
            orch.finish(batch, evaluate=False)
            log.log(step, {**rollout_metrics(batch.groups, []), "time/generate": batch.generate_s})
            if stop():
                break
    log.close()
    return run.root


def run_phase(
    phase: str, cfg: RunConfig, *, resume: str | bool | None, stop: StopFlag
) -> tuple[Path, float]:
    """Dispatch `--phase`; return the run dir and the seconds it took."""
    started = time.monotonic()
    if phase == "rollout":
        run_dir = collect_rollouts(cfg, resume=bool(resume), stop=stop)
    else:
        run_dir = train(cfg, resume=resume, stop=stop, saved_batches=phase == "update")
    return run_dir, time.monotonic() - started


# --- wiring helpers
def load_data(cfg: RunConfig, tokenizer: Any) -> tuple[Any, list[dict], Any, list[dict]]:
    """The training env and rows, and the eval env and its held-out rows (`tokenizer`: or a
    VLM's processor, which measures prompts with their images' tokens)."""
    env, eval_env = load_envs(cfg)
    rows = dataset_rows(env.get_dataset(), tokenizer, cfg.trainer.args.max_prompt_len,
                        allowed_media_dirs(cfg))[0]
    evals = eval_setup(cfg, eval_env, tokenizer)
    return env, rows, evals.get("eval_env", eval_env), evals.get("eval_rows", [])


def load_envs(cfg: RunConfig) -> tuple[Any, Any]:
    """The training environment and the eval environment (the same one unless configured)."""
    from vfkit.envs.registry import load_environment

    a = cfg.trainer.args
    env = load_environment(cfg.env.id, **cfg.env.args)
    env.set_max_seq_len(a.max_seq_len)
    eval_env = env
    if a.eval_steps and (cfg.env.eval_id or cfg.env.eval_args is not None):
        eval_args = cfg.env.args if cfg.env.eval_args is None else cfg.env.eval_args
        eval_env = load_environment(cfg.env.eval_id or cfg.env.id, **eval_args)
        eval_env.set_max_seq_len(a.max_seq_len)
    return env, eval_env


def with_rollout_sampling(cfg: RunConfig, env: Any) -> tuple[RunConfig, SamplingArgs]:
    """The rollouts' sampling args (built-in defaults < the env's own < keys the config sets;
    see vfkit/client/sampling.py) and a config whose temperature and max_tokens, which the loss
    uses, are the ones the rollouts are sampled with."""
    a = cfg.trainer.args
    sampling = a.rollout_sampling_args(env.sampling_args)
    update = {k: sampling[k] for k in ("temperature", "max_tokens") if k in sampling}
    if "max_completion_tokens" in sampling:  # the env's limit in the other spelling
        update["max_tokens"] = sampling["max_completion_tokens"]
    trainer = cfg.trainer.model_copy(update={"args": a.model_copy(update=update)})
    return cfg.model_copy(update={"trainer": trainer}), sampling


def eval_setup(cfg: RunConfig, eval_env: Any, tokenizer: Any) -> dict[str, Any]:
    """The Orchestrator's eval keyword arguments: env, held-out rows, their sampling args."""
    a = cfg.trainer.args
    if not a.eval_steps:
        return {}
    dataset = eval_env.get_eval_dataset(n=a.eval_num_examples, seed=a.seed)
    sampling = a.rollout_sampling_args(eval_env.sampling_args)
    rows = dataset_rows(dataset, tokenizer, a.max_prompt_len, allowed_media_dirs(cfg))[0]
    return {"eval_env": eval_env, "eval_rows": rows, "eval_sampling_args": sampling}


def metrics_logger(cfg: RunConfig, run: RunDir) -> MetricsLogger:
    a = cfg.trainer.args
    return MetricsLogger(
        run.root, report_to=a.report_to, logging_steps=a.logging_steps, max_steps=a.max_steps,
        run_name=cfg.run_name, config=cfg.model_dump(mode="json"),
    )
