"""`vf-rl --dry-run`: check everything a run needs before starting anything, and say what fails.

The checks of the config against the model, environment, output folder and server are
`vfkit.train.run_checks` (the same ones `vf-train` runs before training); this module adds what
only the launcher knows: whether another vf-rl already runs this run, and tmux or foreground.
Nothing is started and nothing is written.
"""

from __future__ import annotations

from pathlib import Path

from vfkit.errors import VfkitError
from vfkit.launch.plan import Plan, make_plan
from vfkit.runlock import lock_holder
from vfkit.train.config import RunConfig
from vfkit.train.resume import require_resumable
from vfkit.train.run_checks import (
    Check,
    ModelInfo,
    check_output_dir,
    check_server,
    check_tensor_parallel,
    static_checks,
)
from vfkit.train.rundir import RunDir, overwrite_error

__all__ = [
    "Check",
    "ModelInfo",
    "check_fresh_or_resumed",
    "check_not_running",
    "check_output_dir",
    "check_server",
    "check_tensor_parallel",
    "run_preflight",
]


def check_not_running(run: RunDir) -> Check:
    """One launcher per run folder, and no other process writing it (a vf-train or vf-eval
    holding its lock): a second one would fight over checkpoints and ports."""
    state = run.read_state()
    pid = state.get("supervisor_pid")
    if pid and state.get("phase") != "done" and Path(f"/proc/{pid}").exists():
        return Check(
            "run",
            False,
            (
                f"run {run.name} is already running (vf-rl pid {pid}); stop it first, or "
                f"`vf-rl --clean {run.root}` if that process is not vf-rl"
            ),
        )
    if (holder := lock_holder(run.root)) is not None:
        return Check("run", False, (
            f"{run.root} is in use by another process (pid {holder}); wait for it to finish or "
            f"stop it (kill {holder}) before running in that folder again"
        ))
    return Check("run", True, f"no other vf-rl runs {run.name}")


def check_fresh_or_resumed(cfg: RunConfig, run: RunDir, resume: str | None) -> Check:
    """A fresh run may not start over an earlier run's checkpoints, nor a resumed one change
    what its checkpoint fixes (vf-train refuses both too, but only after vf-rl started the
    server)."""
    error = overwrite_error(run, resume=resume is not None)
    if error is None and resume is not None:
        try:
            require_resumable(cfg, None if resume == "latest" else resume)
        except VfkitError as exc:
            error = str(exc)
    if error is not None:
        return Check("run", False, error)
    return Check("run", True, f"resume {run.name}" if resume else f"fresh run {run.name}")


def run_preflight(
    cfg: RunConfig,
    config_path: str | Path,
    overrides: list[str],
    *,
    mode: Check,
    resume: str | None = None,
) -> tuple[list[Check], Plan]:
    """All checks after the config loaded; `mode` is the tmux/foreground decision."""
    plan = make_plan(cfg, config_path, overrides, resume=resume)
    checks, plan.prompt_tokens = static_checks(cfg)
    checks[1:1] = [check_not_running(plan.run), check_fresh_or_resumed(cfg, plan.run, resume)]
    checks += [mode, _batch_check(cfg)]
    return checks, plan


def _batch_check(cfg: RunConfig) -> Check:
    a = cfg.trainer.args
    return Check(
        "batch",
        True,
        (
            f"{a.batch_size} rollouts/step = {a.prompts_per_batch} prompts × "
            f"{a.rollouts_per_example}; micro-batch {a.micro_batch_size}"
        ),
    )
