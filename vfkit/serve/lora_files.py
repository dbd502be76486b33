"""An adapter folder as a load request names it: read, validated, turned into PEFT's config.

Every problem is the client's (a 400 or 403 naming the file and what to do), found before the
engine touches the model. Shared by the embedded server and the scripted test server.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfkit.serve.errors import APIError

if TYPE_CHECKING:
    import torch

BASE = "__base__"  # PEFT's name for "no adapter" in a mixed batch


@dataclass(frozen=True)
class AdapterFiles:
    """An adapter folder as read by `check_load`: config, weights as stored, their fingerprint."""

    path: Path
    config: dict[str, Any]
    peft_config: Any  # peft.LoraConfig
    weights: dict[str, torch.Tensor]
    fingerprint: str | None  # None only from the scripted test server (folder without weights)



MAX_NAME_CHARS = 256
_LORA_PARTS = ("lora_A.", "lora_B.", "lora_embedding_A", "lora_embedding_B")


def check_load_request(name: str, path: str, *, loaded: bool, inplace: bool) -> None:
    """vLLM's rules for a load request's name (shared with the scripted test server), and a
    name a client can send back as `model`: printable, not blank, at most 256 characters."""
    if not name or not path:
        raise APIError(
            400, "Both 'lora_name' and 'lora_path' must be provided.", param="lora_name"
        )
    if not name.strip() or not name.isprintable() or len(name) > MAX_NAME_CHARS:
        raise APIError(
            400, f"lora_name must be printable text of 1 to {MAX_NAME_CHARS} characters, not "
            "blank (it is what requests name as `model`).", param="lora_name",
        )
    if "\x00" in path:
        raise APIError(400, "lora_path holds a NUL character.", param="lora_path")
    if name == BASE:
        raise APIError(
            400, f"'{BASE}' is a reserved name; choose another lora_name.", param="lora_name"
        )
    if loaded and not inplace:
        raise APIError(
            400,
            f"The lora adapter '{name}' has already been loaded. "
            "Pass load_inplace=true to replace its weights.",
            param="lora_name",
        )


def module_of(key: str) -> str:
    """The model module a saved PEFT LoRA tensor belongs to:
    'base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight'
    -> 'model.language_model.layers.0.self_attn.q_proj'."""
    return key.removeprefix("base_model.model.").partition(".lora_")[0]


def read_config(folder: Path) -> dict[str, Any]:
    """adapter_config.json as a dict; 400 naming the file when it is missing or not JSON."""
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise APIError(400, f"No adapter_config.json in {folder}.", param="lora_path")
    try:
        config = json.loads(config_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"{config_file} is not valid JSON: {exc}", param="lora_path") from exc
    if not isinstance(config, dict):
        raise APIError(400, f"{config_file} must hold a JSON object.", param="lora_path")
    return config


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors exactly as stored (no cast), on the CPU; 400 if unreadable."""
    from peft.utils import load_peft_weights

    try:
        return load_peft_weights(str(folder), device="cpu")
    except Exception as exc:  # missing file, truncated or foreign format: the client's folder
        raise APIError(
            400, f"Cannot read the adapter weights in {folder}: {exc}", param="lora_path"
        ) from exc


def check_tensors(folder: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """400 naming the first tensor that must not be served: one that is not a LoRA weight
    (PEFT would copy it over the base model, which every request shares; only modules listed
    in `modules_to_save` get their own copy), or one holding NaN or infinity."""
    saved = config.get("modules_to_save") or []
    for key in weights:
        module = key.removeprefix("base_model.model.").rpartition(".")[0]
        own_copy = any(module == m or module.endswith(f".{m}") for m in saved)
        if not any(f".{part}" in key for part in _LORA_PARTS) and not own_copy:
            raise APIError(
                400, f"The adapter in {folder} holds '{key}', which is not a LoRA weight: "
                "serving it would overwrite the base model's own weights. Save only the "
                "adapter (PEFT's save_pretrained), or list the module in modules_to_save.",
                param="lora_path",
            )
    key = first_non_finite(weights)
    if key is not None:
        raise APIError(
            400, f"The adapter in {folder} holds NaN or infinite values in '{key}'; the "
            "training run that wrote it diverged.", param="lora_path",
        )


def first_non_finite(weights: dict[str, torch.Tensor]) -> str | None:
    """A floating-point tensor holding NaN or infinity (the first in order of its dtype),
    else None.

    One fused norm per dtype first: a hot-load runs this on each new adapter, and tensor by
    tensor it took ~26 ms of the load on one CPU thread for a rank-16 SmolLM2 adapter (420
    tensors), fused a few ms. A norm is finite exactly when its tensor is, except that huge
    finite values can overflow it, so only tensors with a non-finite norm are then checked
    element by element.
    """
    import torch

    by_dtype: dict[torch.dtype, list[str]] = {}
    for key, tensor in weights.items():
        if tensor.is_floating_point() and tensor.numel():
            by_dtype.setdefault(tensor.dtype, []).append(key)
    for keys in by_dtype.values():
        norms = torch.stack(torch._foreach_norm([weights[k] for k in keys]))
        for i in torch.nonzero(~torch.isfinite(norms)).flatten().tolist():
            if not torch.isfinite(weights[keys[i]]).all():
                return keys[i]
    return None


def lora_config(folder: Path, config: dict[str, Any]) -> Any:
    """PEFT's LoraConfig from adapter_config.json; 400 naming the folder for a bad field."""
    from peft import LoraConfig

    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise APIError(
            400, f"{folder} holds a {kind} adapter; only LoRA adapters can be served.",
            param="lora_path",
        )
    refused = {
        "use_dora": (config.get("use_dora"), "DoRA adapters cannot be served here (nor by "
                     "vLLM); train a plain LoRA adapter"),
        "bias": (config.get("bias", "none") != "none", "an adapter that trains biases changes "
                 "the base model's own, which every request shares; train with bias='none'"),
    }
    for key, (bad, why) in refused.items():
        if bad:
            raise APIError(400, f"adapter_config.json in {folder}: {key}: {why}.",
                           param="lora_path")
    for key in ("r", "lora_alpha"):
        value = config.get(key, 8)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise APIError(400, f"adapter_config.json in {folder}: '{key}' must be a finite "
                           f"number, not {value!r}.", param="lora_path")
    fields = {k: v for k, v in config.items() if k in LoraConfig.__dataclass_fields__}
    try:
        peft_config = LoraConfig(**fields)
    except Exception as exc:
        raise APIError(
            400, f"adapter_config.json in {folder} is not a usable LoRA config: {exc}",
            param="lora_path",
        ) from exc
    peft_config.inference_mode = True
    return peft_config
