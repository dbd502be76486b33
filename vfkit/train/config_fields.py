"""Checks of single config values (names, URLs, device ids, server args), used by the field
validators of `vfkit.train.config`. Each raises ValueError with what is wrong and what to do;
the loader adds the key and its TOML line.
"""

from __future__ import annotations

import math
import urllib.parse
from typing import Any

# dtypes both servers understand (vLLM's --dtype names; the builtin server maps them to torch)
SERVER_DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")
# [inference.args] keys that must be whole numbers >= 1 (launcher kwargs and common flags)
POSITIVE_INT_SERVER_ARGS = (
    "max_lora_rank", "max_loras", "data_parallel_size", "tensor_parallel_size", "max_model_len",
    "max_num_seqs", "max_queue", "max_prefill_tokens", "threads",
)
REDACTED = "***"  # what a secret shows as in dumps and messages
SECRET_KEYS = ("api_key",)  # keys whose values never appear in dumps or messages


def check_gpus(value: Any) -> Any:
    """"auto", a GPU count >= 0, or a list of device ids >= 0."""
    if isinstance(value, int) and value < 0:
        raise ValueError("must be >= 0 (a count) or a list of device ids")
    if isinstance(value, list) and any(i < 0 for i in value):
        raise ValueError("device ids must be >= 0")
    return value


def not_blank(value: str | None, what: str) -> str | None:
    """`value` unless it is empty or only spaces (then: give `what`)."""
    if value is not None and not value.strip():
        raise ValueError(f"is empty: give {what}")
    return value


def check_folder_name(name: str) -> str:
    """`name` as one folder below output_dir: a run must never write outside output_dir."""
    if "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise ValueError(
            f"{name!r} must be one folder name under output_dir (no '/', '\\', '..'); "
            "put the parent folder in trainer.args.output_dir"
        )
    return name


def check_base_url(value: str) -> str:
    """Empty (start a server), or an http(s) URL with a host and a valid port."""
    if not value:
        return value
    parsed = urllib.parse.urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(
            "must be an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1 "
            "(or empty to let vfkit start a server)"
        )
    try:
        parsed.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError:
        raise ValueError("has a port that is not a number in 0-65535") from None
    return value


def check_server_args(given: dict[str, Any]) -> dict[str, Any]:
    """[inference.args] values we understand: dtype, positive counts, fractions, timeouts
    (flag names are checked against the server's own parser in vfkit.train.run_checks)."""
    args = {key.replace("-", "_"): value for key, value in given.items()}
    dtype = args.get("dtype")
    if dtype is not None and dtype not in SERVER_DTYPES:
        raise ValueError(f"dtype = {dtype!r} is not a dtype: use one of {', '.join(SERVER_DTYPES)}")
    for key in POSITIVE_INT_SERVER_ARGS:
        value = args.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{key} = {value!r} must be a whole number >= 1")
    share = args.get("gpu_memory_utilization")
    if share is not None and not (
        isinstance(share, int | float) and not isinstance(share, bool) and 0 < share <= 1
    ):
        raise ValueError(f"gpu_memory_utilization = {share!r} must be a fraction in (0, 1]")
    timeout = args.get("health_timeout")
    if timeout is not None and not (
        isinstance(timeout, int | float) and not isinstance(timeout, bool)
        and math.isfinite(timeout) and timeout > 0
    ):
        raise ValueError(f"health_timeout = {timeout!r} must be a number of seconds > 0")
    return given


def module_matches(name: str, target: str) -> bool:
    """PEFT's rule for a `lora_target_modules` entry: the module's name is the target or ends
    with "." + target (`q_proj` matches `model.layers.0.self_attn.q_proj`)."""
    return name == target or name.endswith("." + target)
