"""What a resume starts from and may change: the checkpoint to load, and the keys it fixes.

Light on purpose (no torch): `vf-rl --dry-run` asks the same questions as vf-train.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from vfkit.errors import ConfigError, VfkitError
from vfkit.train.rundir import RunDir, run_dir_of


def find_checkpoint(run: RunDir, path: str | None) -> Path:
    """The checkpoint to resume: an explicit path (checkpoint or run dir), else the latest."""
    if path:
        candidate = Path(path)
        if (candidate / "state.json").exists():
            return candidate
        run = RunDir(candidate)
    found = run.list_checkpoints()
    if not found:
        raise VfkitError(
            f"--resume: no checkpoint under {run.checkpoints}; start without --resume,"
            " or pass a checkpoint folder (outputs/<run>/checkpoints/step_N)"
        )
    return found[-1]


# Keys a resumed run cannot change: the adapter's shape (its weights would not load), and the
# optimizer and schedule (their saved state would silently win over the new value).
FIXED_ON_RESUME = (
    ("model",),
    *(("trainer", "args", key) for key in (
        "lora_rank", "lora_alpha", "lora_target_modules", "lora_use_rslora",
        "lora_modules_to_save", "learning_rate", "lr_scheduler_type", "warmup_steps",
        "weight_decay", "adam_beta1", "adam_beta2", "loraplus_lr_ratio",
    )),
)


def require_resumable(cfg: Any, path: str | None) -> None:
    """ConfigError unless `cfg` (a RunConfig) can resume its run from checkpoint `path` (or
    the latest one); vf-train asks before it touches the run folder."""
    run = run_dir_of(cfg)
    error = resume_error(cfg.model_dump(mode="json"), find_checkpoint(run, path), run)
    if error is not None:
        raise ConfigError(error)


def resume_error(resolved: dict[str, Any], checkpoint: Path, run: RunDir) -> str | None:
    """Why the resolved config (`RunConfig.model_dump(mode="json")`) cannot resume from
    `checkpoint`: each fixed key it changes, old -> new; None when none changed (or when no
    record of the old config exists, from before checkpoints kept one)."""
    record = checkpoint / "config.toml"
    record = record if record.exists() else run.config
    if not record.exists():
        return None
    old = tomllib.loads(record.read_text())
    changed = []
    for path in FIXED_ON_RESUME:
        before, after = _lookup(old, path), _lookup(resolved, path)
        if before is not None and before != after:
            changed.append(f"{'.'.join(path)} = {after!r} (the run has {before!r})")
    if not changed:
        return None
    return (f"--resume: {'; '.join(changed)}. A resumed run keeps its adapter shape, optimizer "
            "and schedule: set the run's values back, or start a new run (another "
            "trainer.args.run_name)")


def _lookup(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data
