"""Bring a restarted inference server back to where the trainer left it: its LoRA adapters.

The trainer serves policy N as adapter "<run>-step<N>" from outputs/<run>/adapters/step_<N>
and deletes the folders no queued batch uses, so the newest folders on disk are the adapters
the server had (the one loaded a moment before the crash included). While the server is
healthy the supervisor also snapshots GET /v1/models (entries with a "parent"; vLLM puts the
adapter folder in "root") to catch adapters named otherwise. After a restart both are loaded
again under their names, newest first, so rollouts asking for the current policy find it.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfkit.train.rundir import RunDir

_STEP = re.compile(r"-step(\d+)$")
_FOLDER = re.compile(r"step_(\d+)")


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter the server had loaded: its served name and its folder."""

    name: str
    path: Path


def _request(url: str, api_key: str | None, body: dict | None = None, timeout: float = 10) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def adapter_folder(card: dict[str, Any], run: RunDir) -> Path | None:
    """Where the adapter of a /v1/models card lives on disk, if we can tell."""
    root = card.get("root")
    if isinstance(root, str) and (Path(root) / "adapter_config.json").is_file():
        return Path(root)
    match = _STEP.search(str(card.get("id", "")))
    if match:
        folder = run.adapters / f"step_{match.group(1)}"
        if (folder / "adapter_config.json").is_file():
            return folder
    return None


def loaded_adapters(base_url: str, run: RunDir, api_key: str | None = None) -> list[Adapter] | None:
    """The adapters the server serves now (those whose folder we can find); None if unreachable."""
    try:
        cards = json.loads(_request(base_url.rstrip("/") + "/models", api_key, timeout=3))["data"]
    except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError):
        return None
    found = []
    for card in cards:
        if card.get("parent") and (folder := adapter_folder(card, run)) is not None:
            found.append(Adapter(str(card["id"]), folder))
    return found


def adapters_to_reload(run: RunDir, snapshot: list[Adapter], limit: int = 4) -> list[Adapter]:
    """The snapshot plus the run's adapter folders, newest step first, at most `limit`."""
    found = {a.name: a for a in snapshot}
    folders = run.adapters.glob("step_*") if run.adapters.is_dir() else []
    for folder in folders:
        match = _FOLDER.fullmatch(folder.name)
        if match and (folder / "adapter_config.json").is_file():
            found.setdefault(f"{run.name}-step{match.group(1)}", Adapter("", folder))
    named = [Adapter(name, a.path) for name, a in found.items()]

    def step(adapter: Adapter) -> int:
        match = _STEP.search(adapter.name)
        return int(match.group(1)) if match else -1

    return sorted(named, key=step, reverse=True)[:limit]


def reload_adapters(
    base_url: str, adapters: list[Adapter], api_key: str | None = None
) -> list[str]:
    """Load each adapter into the (restarted) server; returns one line per adapter."""
    lines = []
    for adapter in adapters:
        if not (adapter.path / "adapter_config.json").is_file():
            lines.append(f"adapter {adapter.name}: {adapter.path} is gone (skipped)")
            continue
        body = {
            "lora_name": adapter.name,
            "lora_path": str(adapter.path.resolve()),
            "load_inplace": True,
        }
        try:
            _request(base_url.rstrip("/") + "/load_lora_adapter", api_key, body, timeout=120)
            lines.append(f"re-loaded adapter {adapter.name} from {adapter.path}")
        except (OSError, urllib.error.URLError, ValueError) as exc:
            lines.append(f"could not re-load adapter {adapter.name}: {exc}")
    return lines
