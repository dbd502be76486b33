"""outputs/<run>/: every path under a run, and the adapter names the server knows them by.

This module is the one place that spells the run layout (design "Run directory"); the trainer,
the checkpoints, vf-rl's supervisor, watch, report and clean all ask a `RunDir`:

    run = RunDir(Path("outputs/reverse-text--SmolLM2"))
    run.rollouts_file(3)            # outputs/.../rollouts/step_3.jsonl
    run.adapter_dir(3)              # outputs/.../adapters/step_3
    run.adapter_name(3)             # 'reverse-text--SmolLM2-step3' (served name of policy 3)
    run.version_of("reverse-text--SmolLM2-step3")   # 3

Transient launcher state lives in .vfrl/ (pids, server URL, phase): `vf-rl --clean RUN` removes
it and keeps checkpoints, metrics and rollouts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfkit.errors import VfkitError

if TYPE_CHECKING:
    from vfkit.train.config import RunConfig

_STEP_PREFIX = "step_"
_ADAPTER_SUFFIX = "-step"


def step_of(path: Path) -> int | None:
    """N for a folder or file named step_N(.jsonl); None for anything else."""
    digits = path.name.removesuffix(".jsonl").removeprefix(_STEP_PREFIX)
    return int(digits) if path.name.startswith(_STEP_PREFIX) and digits.isdigit() else None


@dataclass(frozen=True)
class RunDir:
    """The layout of one run's output folder."""

    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    def is_training_run(self) -> bool:
        """Whether vf-train / vf-rl wrote here (config.toml, metrics, checkpoints or launcher
        state): commands that remove or write files in a run refuse any other folder."""
        return any(p.exists() for p in (self.config, self.metrics, self.checkpoints,
                                        self.state_dir))  # fmt: skip

    # --- what the trainer writes
    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    def rollouts_file(self, step: int) -> Path:
        """The rollouts sampled for training step `step` (what `--phase update` reads)."""
        return self.rollouts / f"{_STEP_PREFIX}{step}.jsonl"

    def eval_rollouts_file(self, step: int) -> Path:
        return self.rollouts / f"eval_{_STEP_PREFIX}{step}.jsonl"

    @property
    def adapters(self) -> Path:
        return self.root / "adapters"

    def adapter_dir(self, version: int) -> Path:
        """The adapter of policy `version` (after `version` optimizer steps)."""
        return self.adapters / f"{_STEP_PREFIX}{version}"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"{_STEP_PREFIX}{step}"

    def list_checkpoints(self) -> list[Path]:
        """Complete checkpoints (with state.json), oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = [p for p in self.checkpoints.iterdir()
                 if step_of(p) is not None and (p / "state.json").exists()]
        return sorted(found, key=lambda p: step_of(p) or 0)

    # --- adapter names in the inference server, both ways
    def adapter_name(self, version: int) -> str:
        """The name policy `version` is served under: '<run>-step<version>'."""
        return f"{self.name}{_ADAPTER_SUFFIX}{version}"

    def version_of(self, adapter_name: str) -> int | None:
        """The policy version of one of this run's adapter names; None for other names."""
        prefix = f"{self.name}{_ADAPTER_SUFFIX}"
        digits = adapter_name.removeprefix(prefix)
        return int(digits) if adapter_name.startswith(prefix) and digits.isdigit() else None

    # --- logs and launcher state
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, which: str) -> Path:
        """logs/<which>.log: "server", "trainer", "vf-rl"."""
        return self.logs / f"{which}.log"

    @property
    def server_log(self) -> Path:
        return self.log("server")

    @property
    def trainer_log(self) -> Path:
        return self.log("trainer")

    @property
    def supervisor_log(self) -> Path:
        return self.log("vf-rl")

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def state_dir(self) -> Path:
        return self.root / ".vfrl"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def read_state(self) -> dict[str, Any]:
        """The launcher's shared state ({} when there is none or it is being rewritten)."""
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def update_state(self, **fields: Any) -> dict[str, Any]:
        """Merge fields into the state file atomically (readers never see half a file)."""
        return self.reset_state(**{**self.read_state(), **fields})

    def reset_state(self, **fields: Any) -> dict[str, Any]:
        """Replace the state (a new launch forgets the previous run's pids and exit code)."""
        state = dict(fields)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f"state.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_file)
        return state


_DISK_FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
              errno.EROFS: "the file system is read-only"}


@contextlib.contextmanager
def writing(what: str, path: Path) -> Iterator[None]:
    """VfkitError naming `path` and what to do when writing `what` there fails for lack of
    room (a full disk once ended a run with a torch.save traceback); other errors pass."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _DISK_FULL:
            raise
        raise VfkitError(
            f"cannot write {what} to {path}: {_DISK_FULL[exc.errno]} ({exc.strerror}); free "
            "space there (older checkpoints: trainer.args.save_total_limit), then continue "
            "with --resume from the last complete checkpoint"
        ) from None


def run_dir_of(cfg: RunConfig) -> RunDir:
    """Where a config's run lives: <trainer.args.output_dir>/<run_name>."""
    return RunDir(Path(cfg.trainer.args.output_dir) / cfg.run_name)


def resolve_run_dir(
    run: str | os.PathLike[str], outputs: str | os.PathLike[str] = "outputs"
) -> RunDir:
    """A run given as a path (outputs/x) or a bare name (x, looked up under outputs/)."""
    path = Path(run)
    if not path.exists() and not path.is_absolute() and len(path.parts) == 1:
        candidate = Path(outputs) / path
        with contextlib.suppress(OSError):
            if candidate.exists():
                path = candidate
    return RunDir(path)


def overwrite_error(run: RunDir, *, resume: bool) -> str | None:
    """Why a fresh (not resumed) run may not start in `run`, or None: it would overwrite an
    earlier run's checkpoints and metrics. vf-train and vf-rl's checks both ask here."""
    if resume or not run.list_checkpoints():
        return None
    return (f"{run.root} already holds checkpoints: pass --resume to continue that run, or"
            " choose another trainer.args.run_name (or delete the folder)")


def open_run_dir(cfg: RunConfig, *, resume: bool) -> RunDir:
    """Create (or, resuming, reuse) the run folder and write the resolved config into it."""
    run = run_dir_of(cfg)
    if (error := overwrite_error(run, resume=resume)) is not None:
        raise VfkitError(error)
    for folder in (run.logs, run.rollouts, run.adapters, run.checkpoints):
        folder.mkdir(parents=True, exist_ok=True)
    resolved = cfg.model_dump(mode="json")
    resolved["inference"]["api_key"] = ""  # never write the secret next to the outputs
    run.config.write_text(dump_toml(resolved))
    if not resume:
        run.metrics.unlink(missing_ok=True)
    return run


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return json.dumps(str(value))


def dump_toml(data: dict[str, Any], table: str = "") -> str:
    """A small TOML writer for config trees (scalars, lists, nested tables); None is left out."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"[{table}]"] if table and (scalars or not tables) else []
    lines += [f"{k} = {_toml_value(v)}" for k, v in scalars.items()]
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in tables.items():
        out += "\n" + dump_toml(value, f"{table}.{key}" if table else key)
    return out
