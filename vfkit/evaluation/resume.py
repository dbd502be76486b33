"""`--resume PATH`: take the interrupted run's settings from its metadata.json.

Flags left out are filled from the run; flags given must agree with it (a different -n, -r,
model or sampling args would mix two experiments in one results file).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from vfkit.errors import ConfigError
from vfkit.evaluation.config import EvalConfig
from vfkit.evaluation.results import METADATA_FILE, RESULTS_FILE, read_metadata
from vfkit.evaluation.urls import REDACTED

# EvalConfig field -> (metadata key, flag named in errors)
_PINNED = {
    "env_id": ("env_id", "ENV_ID"),
    "env_args": ("env_args", "-a/--env-args"),
    "model": ("model", "-m/--model"),
    "num_examples": ("num_examples", "-n/--num-examples"),
    "rollouts_per_example": ("rollouts_per_example", "-r/--rollouts-per-example"),
    "sampling_args": ("sampling_args", "-S/-t/-T"),
}


def resume_dir(path: Path) -> Path:
    """The run folder for --resume PATH (the folder itself, or its results/metadata file)."""
    path = Path(path).expanduser()
    if path.name in (RESULTS_FILE, METADATA_FILE):
        path = path.parent
    if not path.is_dir():
        raise ConfigError(
            f"--resume: no run folder at {path}; pass the folder vf-eval printed "
            "(outputs/evals/<env>--<model>/<run id>)"
        )
    return path


def _recorded_base_url(meta: dict, run_dir: Path) -> str | None:
    """The run's -b URL (an embedded server is started afresh instead, so it is not recorded)."""
    url = meta.get("base_url")
    if url and urlsplit(url).password == REDACTED:
        raise ConfigError(
            f"--resume: the server URL of {run_dir} held a password, which vf-eval never writes "
            "down; pass the URL again with -b/--api-base-url"
        )
    return url


def apply_resumed_settings(cfg: EvalConfig) -> Path:
    """Fill `cfg` from the resumed run's metadata; returns the run folder to append to."""
    if cfg.resume is None:
        raise ValueError("apply_resumed_settings needs cfg.resume")
    run_dir = resume_dir(cfg.resume)
    meta = read_metadata(run_dir)
    for attr, (key, flag) in _PINNED.items():
        recorded = meta.get(key)
        given = getattr(cfg, attr)
        if given is None or given == {}:
            setattr(cfg, attr, recorded if recorded is not None else given)
        elif attr == "num_examples" and given == -1:
            pass  # "all of them": checked against the run's count once the dataset is loaded
        elif recorded is not None and given != recorded:
            raise ConfigError(
                f"--resume: {flag} is {given!r} here but {recorded!r} in {run_dir}; "
                "leave the flag out to continue that run, or start a new run without --resume"
            )
    if not cfg.state_columns:
        cfg.state_columns = list(meta.get("state_columns") or [])
    if cfg.endpoints_path is None and meta.get("endpoints_path"):
        cfg.endpoints_path = Path(meta["endpoints_path"])  # the registry -m was looked up in
    if cfg.api_base_url is None and meta.get("endpoint_source") == "flag":
        cfg.api_base_url = _recorded_base_url(meta, run_dir)
    try:
        cfg.validate()  # what came from metadata.json passes the same checks as the flags
    except ConfigError as exc:
        raise ConfigError(f"--resume: {run_dir / METADATA_FILE} holds a bad value: {exc}") from None
    return run_dir


def check_resumed_examples(run_dir: Path, loaded: int, asked: int | None) -> None:
    """ConfigError unless the dataset gave as many examples as the resumed run has (`-n -1`
    is accepted when that is all of them; a dataset that changed size is caught here too)."""
    recorded = read_metadata(run_dir).get("num_examples")
    if not isinstance(recorded, int) or recorded == loaded:
        return
    flag = "-n -1 (all examples)" if asked == -1 else f"-n {asked}"
    raise ConfigError(
        f"--resume: {flag} gives {loaded} examples here, but {run_dir} ran {recorded}; leave -n "
        "out to continue that run (or the environment's dataset changed: start a new run)"
    )
