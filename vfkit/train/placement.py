"""Where a run's parts go: the server backend, GPU ids, CPU thread split, the server's flags.

`inference_server` yields the URL rollouts use: `inference.base_url`, or a server started here
with those choices (vfkit/serve/launcher.py starts and health-checks it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vfkit.errors import VfkitError
from vfkit.train.config import RunConfig
from vfkit.train.rundir import RunDir

# [inference.args] keys that are start_server() parameters; the rest become --flags
LAUNCHER_KWARGS = (
    "max_lora_rank", "max_loras", "dtype", "health_timeout", "data_parallel_size",
    "tensor_parallel_size",
)


def choose_backend(cfg: RunConfig) -> str:
    """auto -> vLLM when CUDA and vllm are both there, else the builtin CPU server."""
    if cfg.inference.backend != "auto":
        return cfg.inference.backend
    import torch

    has_vllm = importlib.util.find_spec("vllm") is not None
    return "vllm" if torch.cuda.is_available() and has_vllm else "builtin"


def device_ids(cfg: RunConfig) -> tuple[list[int] | None, list[int] | None]:
    """GPU ids of (server, trainer), among the devices visible here: explicit lists as given;
    counts take devices in order, the server's first; [] = the CPU; None = "auto" (whatever
    the process finds: the first GPU when there is one, else the CPU)."""
    inf, tr = cfg.inference.gpus, cfg.trainer.gpus
    inf_ids = None if inf == "auto" else inf if isinstance(inf, list) else list(range(inf))
    start = len(inf_ids) if isinstance(inf, int) else 0
    tr_ids = None if tr == "auto" else tr if isinstance(tr, list) else [*range(start, start + tr)]
    return inf_ids, tr_ids


def describe_devices(ids: list[int] | None) -> str:
    """How the dry run names a process's devices."""
    if ids is None:
        return "auto: the first GPU if any, else CPU"
    return "CPU" if not ids else "GPU " + ",".join(map(str, ids))


def trainer_on_cpu(cfg: RunConfig) -> bool:
    """Whether the trainer runs on the CPU: `trainer.gpus = 0`, or "auto" with no GPU."""
    import torch

    return device_ids(cfg)[1] == [] or not torch.cuda.is_available()


def server_on_cpu(cfg: RunConfig) -> bool:
    """Whether a server started here runs on the CPU (`inference.gpus = 0`, or "auto" with no
    GPU); it is then the builtin one, as vLLM needs a GPU."""
    import torch

    return device_ids(cfg)[0] == [] or not torch.cuda.is_available()


def flag_args(args: dict[str, Any]) -> list[str]:
    """{"enforce_eager": True, "gpu_memory_utilization": 0.5} -> ["--enforce-eager", ...].

    A table or list value becomes JSON, as vLLM reads it (and vf-serve, for the image flags):
    `limit_mm_per_prompt = {image = 4}` -> `--limit-mm-per-prompt '{"image": 4}'`.
    """
    out: list[str] = []
    for key, value in args.items():
        if key in LAUNCHER_KWARGS:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, dict | list):
            out += [flag, json.dumps(value)]
        elif value is not False:
            out += [flag, str(value)]
    return out


def cpu_threads(cfg: RunConfig) -> tuple[int, int] | None:
    """(server, trainer) torch threads when both run on this machine's CPU, else None.

    Two processes that each take every core thrash (measured ~8x slower steps on 2 cores), so
    the cores are split: half for the trainer, the rest for the builtin server.
    """
    if not (server_on_cpu(cfg) and trainer_on_cpu(cfg)) or choose_backend(cfg) != "builtin":
        return None
    host = urllib.parse.urlparse(cfg.inference.base_url).hostname
    if cfg.inference.base_url and host not in ("127.0.0.1", "localhost", "::1"):
        return None
    cores = os.cpu_count() or 1
    trainer = max(1, cores // 2)
    return int(cfg.inference.args.get("threads", max(1, cores - trainer))), trainer


def launcher_kwargs(cfg: RunConfig, run: RunDir) -> dict[str, Any]:
    """Keyword arguments for vfkit.serve.launcher.start_server."""
    inf = cfg.inference
    kwargs = {k: inf.args[k] for k in LAUNCHER_KWARGS if k in inf.args}
    extra = flag_args(inf.args)
    split = cpu_threads(cfg)
    if split and "threads" not in inf.args:
        extra += ["--threads", str(split[0])]
    if choose_backend(cfg) == "vllm" and "logprobs_mode" not in inf.args:
        # the loss needs the logprobs of the distribution sampled from (after temperature);
        # vLLM returns raw-logit logprobs unless told otherwise
        extra += ["--logprobs-mode", "processed_logprobs"]
    return {
        "backend": choose_backend(cfg),
        "host": inf.host,
        "port": inf.port or None,
        "api_key": inf.api_key or None,
        "allowed_adapter_dirs": [str(run.root.resolve())],
        "log_path": str(run.server_log),
        "extra_args": extra,
        **kwargs,
    }


# CUDA_VISIBLE_DEVICES as vf-rl / vf-train found it ("unset": no such variable), kept for the
# server a trainer starts after hiding the GPUs that are not its own: config ids count among these
SEEN_DEVICES = "VFKIT_SEEN_CUDA_VISIBLE_DEVICES"


def _seen_devices() -> str | None:
    seen = os.environ.get(SEEN_DEVICES)
    if seen is None:
        return os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if seen == "unset" else seen


def visible_value(ids: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES that shows a child exactly `ids` of the devices visible to this
    run ("" = none: the CPU). Ids index the devices the run was given: under a scheduler's
    CUDA_VISIBLE_DEVICES=4,5, id 1 is device 5."""
    seen = _seen_devices()
    if seen is None or not seen.strip():
        return ",".join(map(str, ids))
    names = [d.strip() for d in seen.split(",")]
    return ",".join(names[i] if i < len(names) else str(i) for i in ids)


@contextlib.contextmanager
def visible_devices(ids: list[int] | None) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES for a child process started inside the block: `ids` of the run's
    devices, or (None, "auto") all of them, as vf-rl / vf-train found them."""
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    if ids is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_value(ids)
    elif SEEN_DEVICES in os.environ:
        _set_or_pop("CUDA_VISIBLE_DEVICES", _seen_devices())
    try:
        yield
    finally:
        _set_or_pop("CUDA_VISIBLE_DEVICES", old)


def _set_or_pop(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def relaunched() -> bool:
    """Whether this vf-train was re-executed by another (accelerate's ranks, or to hide the
    GPUs that are not its own): that one checked the config, against its view of the GPUs."""
    return "LOCAL_RANK" in os.environ or SEEN_DEVICES in os.environ


def check_one_gpu_per_rank(on_cpu: bool) -> None:
    """Refuse trainer processes that would share a GPU: NCCL cannot put two ranks on one
    device and says so only deep inside DDP ("Duplicate GPU detected")."""
    import torch

    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = 0 if on_cpu or not torch.cuda.is_available() else torch.cuda.device_count()
    if gpus and ranks > gpus:
        raise VfkitError(
            f"{ranks} trainer processes on this machine but {gpus} GPU(s) visible to them: "
            f"launch at most {gpus} (e.g. `accelerate launch --num_processes {gpus}`), or set "
            "[trainer] gpus = 0 to train on CPU processes")


def trainer_environ(cfg: RunConfig) -> dict[str, str] | None:
    """The environment vf-train must re-execute itself with so that CUDA shows it only its
    own GPUs (None: none needed: "auto", the CPU, or already done). Set before CUDA starts,
    as CUDA reads the variable once; the run's own view is kept for the server it starts."""
    ids = device_ids(cfg)[1]
    if not ids or relaunched():
        return None
    env = dict(os.environ)
    env[SEEN_DEVICES] = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    env["CUDA_VISIBLE_DEVICES"] = visible_value(ids)
    return env


def server_starter(
    cfg: RunConfig, run: RunDir, model_dir: Callable[[], str], *, wait: bool = True
) -> Callable[[int | None], Any]:
    """start(port): the run's server process on `port` (None: the config's), with the config's
    backend, flags and devices; the one recipe vf-train and vf-rl's supervisor both use.
    `wait`: return once it is healthy (else at once: the caller waits)."""
    from vfkit.serve.launcher import start_server

    kwargs = launcher_kwargs(cfg, run)
    if not wait:
        kwargs.pop("health_timeout", None)

    def start(port: int | None) -> Any:
        with visible_devices(device_ids(cfg)[0]):
            return start_server(model_dir(), **{**kwargs, "port": port or kwargs["port"]},
                                wait=wait)

    return start


@dataclasses.dataclass
class ServerInUse:
    """The server rollouts use: its URL, and why it is gone for good (None: it serves, or it
    is not ours to watch)."""

    base_url: str
    failure: Callable[[], str | None] = lambda: None


@contextlib.contextmanager
def inference_server(cfg: RunConfig, model_dir: Path, run: RunDir) -> Iterator[ServerInUse]:
    """The server to use: `inference.base_url`, or one started here, kept running (restarted if
    it dies) and stopped on exit."""
    if cfg.inference.base_url:
        yield ServerInUse(cfg.inference.base_url.rstrip("/"))
        return
    from vfkit.serve.launcher import KeptServer

    # started again on its port if it dies mid-run
    server = KeptServer(server_starter(cfg, run, lambda: str(model_dir)))
    try:
        yield ServerInUse(server.base_url, lambda: server.failure)
    finally:
        server.stop()
