"""Where a run's parts go: the server backend, GPU ids, CPU thread split, the server's flags.

`inference_server` yields the URL rollouts use: `inference.base_url`, or a server started here
with those choices (vfkit/serve/launcher.py starts and health-checks it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vfkit.train.config import RunConfig, gpu_count
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


def device_ids(cfg: RunConfig) -> tuple[list[int], list[int]]:
    """GPU ids of (server, trainer): explicit lists as given; counts take devices in order."""
    inf, tr = cfg.inference.gpus, cfg.trainer.gpus
    inf_ids = inf if isinstance(inf, list) else list(range(inf))
    start = 0 if isinstance(inf, list) else gpu_count(inf)
    tr_ids = tr if isinstance(tr, list) else list(range(start, start + tr))
    return inf_ids, tr_ids


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
    import torch

    if torch.cuda.is_available() or choose_backend(cfg) != "builtin":
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


@contextlib.contextmanager
def visible_devices(ids: list[int]) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES for a child process started inside the block."""
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    if ids:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


@contextlib.contextmanager
def inference_server(cfg: RunConfig, model_dir: Path, run: RunDir) -> Iterator[str]:
    """Yield the server's base URL; a server we started is kept running (restarted if it dies)
    and stopped on exit."""
    if cfg.inference.base_url:
        yield cfg.inference.base_url.rstrip("/")
        return
    from vfkit.serve.launcher import KeptServer, start_server

    kwargs = launcher_kwargs(cfg, run)

    def start(port: int | None) -> Any:  # waits until healthy
        with visible_devices(device_ids(cfg)[0]):
            return start_server(str(model_dir), **{**kwargs, "port": port or kwargs["port"]})

    server = KeptServer(start)  # started again on its port if it dies mid-run
    try:
        yield server.base_url
    finally:
        server.stop()
