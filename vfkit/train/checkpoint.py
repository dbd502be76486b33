"""Checkpoints that a killed run resumes from exactly: written to a tmp dir, then renamed.

checkpoints/step_N/
    adapter/                 the LoRA adapter after step N (policy version N)
    policies/step_V/         older adapters still sampling in-flight batches (async_level > 0)
    optimizer.pt scheduler.pt rng.pt
    state.json               step, policy version, data cursor, seed, ...
    metrics.jsonl            the run's metrics up to step N
    config.toml              the resolved config the run had (a resume is checked against it)
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file

from vfkit.errors import VfkitError
from vfkit.train.policy import save_adapter
from vfkit.train.resume import find_checkpoint
from vfkit.train.rundir import RunDir, step_of

__all__ = ["find_checkpoint", "load_checkpoint", "policy_dirs", "save_checkpoint"]


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run: RunDir,
    step: int,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    policies: dict[int, Path],
    total_limit: int,
) -> Path:
    """Write checkpoints/step_<step> atomically and prune old ones beyond `total_limit`."""
    final = run.checkpoint_dir(step)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_adapter(model, tmp / "adapter")
        for version, adapter_dir in policies.items():
            shutil.copytree(adapter_dir, tmp / "policies" / run.adapter_dir(version).name)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        for record in (run.metrics, run.config):
            if record.exists():
                shutil.copy(record, tmp / record.name)
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # give back the room a half checkpoint took
        raise
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if total_limit:
        for old in run.list_checkpoints()[:-total_limit]:
            doomed = old.with_name(f".{old.name}.deleting")  # never half a step_N if killed
            old.rename(doomed)
            shutil.rmtree(doomed)
    return final


def load_checkpoint(
    path: Path, *, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict[str, Any]:
    """Restore adapter, optimizer, scheduler and RNG from `path`; return its state.json."""
    weights = load_file(path / "adapter" / "adapter_model.safetensors")
    try:
        result = set_peft_model_state_dict(model, weights)
    except RuntimeError as exc:  # size mismatches: another lora_rank, target set or model
        first = str(exc).split("size mismatch for ", 1)[-1].split("\n", 1)[0][:200]
        raise VfkitError(
            f"--resume: the adapter in {path} does not fit this run's model and LoRA settings "
            f"({first}); resume with the settings it was trained with (model, "
            "trainer.args.lora_*), or start a new run (another trainer.args.run_name)"
        ) from None
    if getattr(result, "unexpected_keys", None):
        raise VfkitError(f"{path}: adapter does not match the model ({result.unexpected_keys[:3]})")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "state.json").read_text())


def policy_dirs(path: Path) -> dict[int, Path]:
    """The adapters saved with a checkpoint, by policy version (its own one included)."""
    state = json.loads((path / "state.json").read_text())
    folders = (path / "policies").iterdir() if (path / "policies").is_dir() else []
    dirs = {v: p for p in folders if (v := step_of(p)) is not None}
    dirs[state["policy_version"]] = path / "adapter"
    return dirs

