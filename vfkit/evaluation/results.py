"""The files of an eval run: results.jsonl (one row per rollout) and metadata.json.

Rows are appended a whole group at a time, with one `write` and an fsync, so an interrupted run
leaves complete groups plus at most one torn last line, which `load_results` drops (a damaged
line anywhere else is an error naming it, never a silent truncation). A resumed run
reads the (example_id, rollout_idx) pairs already there and skips them.

Read a run back in one line:
    pd.read_json("outputs/evals/<env>--<model>/<id>/results.jsonl", lines=True)
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfkit.errors import ConfigError, VfkitError
from vfkit.types import State, StopCondition

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
METADATA_FILE = "metadata.json"

# Columns every row has; a reward function whose name collides is written as "metric_<name>".
BASE_COLUMNS = (
    "example_id", "rollout_idx", "prompt", "completion", "answer", "task", "info", "reward",
    "error", "is_truncated", "stop_condition", "timing",
)  # fmt: skip


class ResultsWriteError(VfkitError, OSError):
    """results.jsonl or metadata.json could not be written (a full disk, a lost permission).

    `unsaved`: finished rollouts whose rows were not written (they run again on --resume).
    """

    def __init__(self, path: Path, cause: OSError, unsaved: int = 0) -> None:
        lost = f"; {unsaved} finished rollouts were not saved and will run again" if unsaved else ""
        super().__init__(
            f"cannot write {path}: {cause.strerror or cause}{lost}. Free space (or fix the "
            f"folder's permissions), then continue with --resume {path.parent}"
        )
        self.errno, self.path, self.unsaved = cause.errno, path, unsaved


def _jsonable(value: Any) -> Any:
    """Turn state values (pydantic objects, sets, enums...) into plain JSON values."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def metric_column(name: str) -> str:
    """The results column for reward function `name`."""
    return f"metric_{name}" if name in BASE_COLUMNS else name


def check_state_columns(columns: list[str], metric_names: list[str] = ()) -> None:
    """ConfigError naming -C for a state column that every row already has (it was ignored)."""
    taken = {*BASE_COLUMNS, *(metric_column(m) for m in metric_names)}
    clash = [c for c in columns if c in taken]
    if clash:
        raise ConfigError(
            f"-C/--state-columns: {', '.join(map(repr, clash))} is already a column of every "
            f"row (fixed columns: {', '.join(BASE_COLUMNS)}; plus one per reward function); "
            "leave it out"
        )


def state_to_row(state: State, rollout_idx: int, state_columns: list[str] = ()) -> dict[str, Any]:
    """One results.jsonl row for a rollout: the fixed columns, one per metric, chosen state keys."""
    row: dict[str, Any] = {
        "example_id": state.get("example_id"),
        "rollout_idx": rollout_idx,
        "prompt": state.get("prompt"),
        "completion": state.get("completion"),
        "answer": state.get("answer", ""),
        "task": state.get("task", "default"),
        "info": state.get("info") or {},
        "reward": state.get("reward", 0.0),
        "error": state.get("error"),
        "is_truncated": bool(state.get("is_truncated", False)),
        "stop_condition": state.get("stop_condition"),
        "timing": state.get("timing") or {},
    }
    for name, value in (state.get("metrics") or {}).items():
        row[metric_column(name)] = value
    for column in state_columns:
        row.setdefault(column, state.get(column))
    return _jsonable(row)


def check_writable_folder(folder: Path, flag: str) -> None:
    """ConfigError naming `flag` unless `folder` is, or can be made, a folder vf-eval can write.

    Tried by making and removing a temporary folder in its nearest existing ancestor, so that
    nothing is left behind and a bad -o is refused before a server is started or contacted.
    """
    folder = Path(folder).expanduser().absolute()
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"{flag}: {existing} is a file, so {folder} cannot be a folder; pass a folder path"
        )
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as exc:
        raise ConfigError(
            f"{flag}: cannot create or write {folder} ({exc.strerror or exc}); pass a folder "
            "you can write to"
        ) from None


def _parse_row(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """One results line as a row, or None and what is wrong with it."""
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"not valid JSON ({getattr(exc, 'msg', exc)})"
    if not isinstance(row, dict):
        return None, "not a JSON object"
    for key in ("example_id", "rollout_idx"):
        if not isinstance(row.get(key), int) or isinstance(row.get(key), bool):
            return None, f"has no integer {key!r}"
    return row, ""


def load_results(path: Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """Read results.jsonl; a damaged line in the middle is a ConfigError naming file and line.

    A kill while writing can only tear the last line: that one (a line without its newline, or
    an unreadable last line) is dropped with a warning, and cut off the file when `repair`.
    A rollout written twice counts once.
    """
    if not path.is_file():
        return []
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    rows: list[dict[str, Any]] = []
    seen: set[tuple[Any, Any]] = set()
    good_end = 0
    for number, line in enumerate(lines, start=1):
        row, problem = _parse_row(line) if line.strip() else (None, "")
        if row is not None and not line.endswith(b"\n"):
            row, problem = None, "ends without a newline"
        if problem and number == len(lines):
            log.warning("%s line %d %s: dropped as the torn end of an interrupted write; "
                        "its rollout runs again", path, number, problem)
            break
        if problem:
            raise ConfigError(
                f"{path} line {number} is {problem}. Only the last line can be torn by a kill, "
                "so the file was damaged otherwise: fix or delete that line (its rollout then "
                "runs again with --resume)"
            )
        good_end += len(line)
        key = (row.get("example_id"), row.get("rollout_idx")) if row else None
        if key is None:
            continue  # a blank line
        if key in seen:
            log.warning("%s line %d repeats example %s rollout %s; the first one counts",
                        path, number, *key)
            continue
        seen.add(key)
        rows.append(row)
    if repair and good_end < len(data):
        with path.open("r+b") as f:
            f.truncate(good_end)
    return rows


def completed_rollouts(rows: list[dict[str, Any]]) -> dict[int, set[int]]:
    """example_id -> rollout indices already in the results."""
    done: dict[int, set[int]] = defaultdict(set)
    for row in rows:
        done[row["example_id"]].add(row["rollout_idx"])
    return dict(done)


class ResultsWriter:
    """Appends whole groups of rows to results.jsonl, flushing every `save_every` rollouts."""

    def __init__(self, run_dir: Path, save_every: int = 1) -> None:
        self.path = run_dir / RESULTS_FILE
        self.save_every = save_every
        self._pending: list[bytes] = []
        self._pending_rows = 0
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        except OSError as exc:
            raise ResultsWriteError(self.path, exc) from None

    def add_group(self, rows: list[dict[str, Any]]) -> bool:
        """Queue one group's rows; write them once `save_every` rollouts wait (True: written)."""
        lines = b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)
        self._pending.append(lines)
        self._pending_rows += len(rows)
        if self._pending_rows < self.save_every:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Append everything queued in one write, then fsync (a kill leaves whole groups).

        A write that fails (ENOSPC...) is cut off again, so no torn line stays in the middle of
        the file; the queued rows are dropped and ResultsWriteError says how many.
        """
        if not self._pending:
            return
        data = b"".join(self._pending)
        unsaved = self._pending_rows
        self._pending.clear()
        self._pending_rows = 0
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ResultsWriteError(self.path, exc, unsaved) from None
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise ResultsWriteError(self.path, exc, unsaved) from None
        finally:
            os.close(fd)


def write_metadata(run_dir: Path, metadata: dict[str, Any]) -> None:
    """Write metadata.json atomically (a temp file renamed over the old one); on failure the
    old file stays, the temp file is removed, and ResultsWriteError names the file."""
    tmp = run_dir / f".{METADATA_FILE}.tmp"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(_jsonable(metadata), indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, run_dir / METADATA_FILE)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ResultsWriteError(run_dir / METADATA_FILE, exc) from None


def read_metadata(run_dir: Path) -> dict[str, Any]:
    """metadata.json of an earlier run (for --resume); errors say what to pass instead."""
    path = run_dir / METADATA_FILE
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"--resume: {run_dir} has no {METADATA_FILE}; pass the run folder that vf-eval "
            "printed (outputs/evals/<env>--<model>/<run id>)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--resume: {path} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"--resume: {path} is not a JSON object; was it written by vf-eval?")
    return meta


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def rollout_failed(row: dict[str, Any]) -> bool:
    """True when the rollout itself failed: it has no reward, so no mean counts it (a reward
    function's error still scores its row)."""
    return row.get("stop_condition") == StopCondition.ERROR.value


@dataclass
class Summary:
    """Aggregates over the rows of a run: reward and each metric, overall and per rollout index.

    Means are over the scored rows only: a rollout that failed (`rollout_failed`) is saved with
    its error and counted in `failed`, never averaged in as a reward of 0.
    """

    num_rollouts: int = 0
    failed: int = 0  # rows whose rollout failed: left out of every mean
    errors: int = 0  # rows with an error (failed rollouts and reward functions that raised)
    truncated: int = 0
    prompt_too_long: int = 0
    columns: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (mean, std)
    by_rollout_idx: dict[str, dict[int, float]] = field(default_factory=dict)  # name -> idx -> mean

    @property
    def scored(self) -> int:
        """Rows the means are over."""
        return self.num_rollouts - self.failed

    @classmethod
    def of(cls, rows: list[dict[str, Any]], metric_names: list[str]) -> Summary:
        """Summarize `rows`; `metric_names` are the reward functions' names."""
        summary = cls(
            num_rollouts=len(rows),
            failed=sum(1 for r in rows if rollout_failed(r)),
            errors=sum(1 for r in rows if r.get("error")),
            truncated=sum(1 for r in rows if r.get("is_truncated")),
            prompt_too_long=sum(
                1 for r in rows if r.get("stop_condition") == StopCondition.PROMPT_TOO_LONG.value
            ),
        )
        scored = [r for r in rows if not rollout_failed(r)]
        for name in ["reward", *(metric_column(m) for m in metric_names)]:
            valued = [r for r in scored if isinstance(r.get(name), int | float)]
            summary.columns[name] = _mean_std([float(r[name]) for r in valued])
            per_idx: dict[int, list[float]] = defaultdict(list)
            for r in valued:
                per_idx[r["rollout_idx"]].append(float(r[name]))
            summary.by_rollout_idx[name] = {
                i: statistics.fmean(v) for i, v in sorted(per_idx.items())
            }
        return summary

    def averages(self) -> dict[str, float | None]:
        """name -> mean (None where nothing was scored), for metadata.json."""
        return {k: (None if math.isnan(m) else m) for k, (m, _) in self.columns.items()}
