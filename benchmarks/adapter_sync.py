"""Time one policy hand-over, part by part, as `vf-train` does it after every step.

    flock /tmp/vfkit_heavy.lock .venv/bin/python benchmarks/adapter_sync.py     # SmolLM2-135M

Each round nudges a rank-16 all-linear LoRA (configs/exp.toml's), then: saves it
(`save_adapter`), fingerprints the saved file (the trainer's side of the check), hot-loads it
into a running vf-serve under a new name (`AdapterSync.load`: the POST and /v1/models), and
unloads the previous version. `time/sync` in a run's metrics is fingerprint + load + unload.
Prints one JSON line per round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def lora_model(model: str, rank: int):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from vfkit.hub import resolve_model

    base = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear")
    return get_peft_model(base, config)


def nudge(peft_model, step: int) -> None:
    """A different adapter each round (as training makes one)."""
    import torch

    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.full_like(param, 1e-4 * step))


async def rounds(base_url: str, peft_model, work: Path, n: int) -> list[dict]:
    from vfkit.lora_fingerprint import fingerprint_dir
    from vfkit.train.adapter_sync import AdapterSync
    from vfkit.train.policy import save_adapter

    sync = AdapterSync(base_url)
    out, previous = [], None
    for step in range(1, n + 1):
        nudge(peft_model, step)
        t0 = time.perf_counter()
        path = save_adapter(peft_model, work / f"step_{step}")
        t1 = time.perf_counter()
        trained = fingerprint_dir(path)
        t2 = time.perf_counter()
        card = await sync.load(f"run-step-{step}", path)
        t3 = time.perf_counter()
        if previous is not None:
            await sync.unload(previous)
        t4 = time.perf_counter()
        assert card.get("fingerprint") == trained, "the server read other weights"
        previous = f"run-step-{step}"
        out.append({"step": step, "save_ms": 1000 * (t1 - t0), "fingerprint_ms": 1000 * (t2 - t1),
                    "load_ms": 1000 * (t3 - t2), "unload_ms": 1000 * (t4 - t3),
                    "sync_ms": 1000 * (t4 - t1)})
        print(json.dumps({k: round(v, 1) for k, v in out[-1].items()}), flush=True)
    await sync.aclose()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--server-args", default="", help="extra vf-serve flags")
    args = p.parse_args()

    from vfkit.serve.launcher import start_server

    peft_model = lora_model(args.model, args.rank)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with start_server(args.model, allowed_adapter_dirs=[work], log_path=work / "server.log",
                          extra_args=args.server_args.split()) as server:
            results = asyncio.run(rounds(server.base_url, peft_model, work, args.rounds))
    steady = results[1:]  # the first load also wraps the model in PEFT
    medians = {k: round(statistics.median(r[k] for r in steady), 1)
               for k in steady[0] if k != "step"}
    first = round(results[0]["load_ms"])
    print(json.dumps({"median_after_first": medians, "first_load_ms": first}))


if __name__ == "__main__":
    main()
