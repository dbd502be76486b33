"""An adapter folder as a load request names it: read, validated, turned into PEFT's config.

Every problem is the client's (a 400 or 403 naming the file and what to do), found before the
engine touches the model. Shared by the embedded server and the scripted test server.
"""

from __future__ import annotations

import json
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



def check_load_request(name: str, path: str, *, loaded: bool, inplace: bool) -> None:
    """vLLM's rules for a load request's name (shared with the scripted test server)."""
    if not name or not path:
        raise APIError(
            400, "Both 'lora_name' and 'lora_path' must be provided.", param="lora_name"
        )
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


def lora_config(folder: Path, config: dict[str, Any]) -> Any:
    """PEFT's LoraConfig from adapter_config.json; 400 naming the folder for a bad field."""
    from peft import LoraConfig

    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise APIError(
            400, f"{folder} holds a {kind} adapter; only LoRA adapters can be served.",
            param="lora_path",
        )
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
