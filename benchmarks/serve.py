"""Output tokens/s of the embedded server at 1, 8 and 32 concurrent requests, base and LoRA.

    flock /tmp/vfkit_heavy.lock .venv/bin/python benchmarks/serve.py            # SmolLM2-135M
    .venv/bin/python benchmarks/serve.py --base-url http://127.0.0.1:8000/v1     # any server

Each of C workers sends chat requests back to back (max_tokens=128, ignore_eos, temperature 1)
for at least --seconds; throughput = completion tokens / wall time. With --lora, a rank-16
adapter on all linear layers (random non-zero weights) is loaded and the requests name it.
`--lora-paths` also times one decode step per LoRA execution path (see `lora_step_ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain how a bicycle stays upright.",
    "List some facts about the moon.",
    "Describe a walk through a forest in autumn.",
]


def make_adapter(model_path: Path, out: Path, rank: int = 16) -> Path:
    """A rank-`rank` LoRA on every linear layer, with non-zero B so it does real work."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=False)
    peft_model = get_peft_model(base, config)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=1e-3)  # small: the text stays sensible
    peft_model.save_pretrained(out)
    return out


def request_max_tokens(k: int, max_tokens: int, vary: bool) -> int:
    """Fixed lengths, or (vary) a deterministic spread over [max_tokens/4, 2*max_tokens]."""
    if not vary:
        return max_tokens
    low, high = max_tokens // 4, 2 * max_tokens
    return low + (k * 7919) % (high - low + 1)


async def measure(base_url: str, model: str, concurrency: int, args: argparse.Namespace) -> dict:
    """Completion tokens per second with `concurrency` workers sending requests back to back."""
    body = {"model": model, "temperature": 1.0, "ignore_eos": True}
    tokens, requests = 0, 0
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:

        async def worker(k: int, deadline: float) -> None:
            nonlocal tokens, requests
            while time.monotonic() < deadline:
                messages = [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}]
                limit = request_max_tokens(k, args.max_tokens, args.vary)
                r = await http.post(
                    "/chat/completions", json={**body, "messages": messages, "max_tokens": limit}
                )
                r.raise_for_status()
                tokens += r.json()["usage"]["completion_tokens"]
                requests += 1
                k += concurrency

        warm = {**body, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        await http.post("/chat/completions", json=warm)
        before = await _stats(http)
        start = time.monotonic()
        deadline = start + args.seconds

        async def at_deadline() -> dict | None:
            await asyncio.sleep(args.seconds)
            return await _stats(http)

        snapshot = asyncio.ensure_future(at_deadline())
        await asyncio.gather(*(worker(i, deadline) for i in range(concurrency)))
        elapsed = time.monotonic() - start
        engine = _engine_summary(before, await _stats(http), elapsed)
        if before and (mid := await snapshot):
            # tokens sampled while all C clients were busy (no tail of the last round)
            sampled = mid["decode_rows"] + mid["admitted"] - before["decode_rows"]
            engine["window_tok_per_s"] = round((sampled - before["admitted"]) / args.seconds, 1)
    return {
        "concurrency": concurrency,
        "requests": requests,
        "tokens": tokens,
        "seconds": round(elapsed, 2),
        "tok_per_s": round(tokens / elapsed, 1),
        **engine,
    }


async def _stats(http: httpx.AsyncClient) -> dict | None:
    """The embedded server's /stats counters (None on other servers)."""
    r = await http.get(str(http.base_url).removesuffix("/").removesuffix("/v1") + "/stats")
    return r.json() if r.status_code == 200 else None


def _engine_summary(before: dict | None, after: dict | None, elapsed: float) -> dict:
    """Where the server's time went during one measurement."""
    if not before or not after:
        return {}
    d = {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, int | float)}
    steps = max(d["decode_steps"], 1)
    return {
        "busy_frac": round(d["busy_s"] / elapsed, 2),
        "rows_per_step": round(d["decode_rows"] / steps, 1),
        "decode_ms_per_step": round(1000 * d["decode_s"] / steps, 1),
        "sample_ms_per_step": round(1000 * d["sample_s"] / steps, 1),
        "prefill_s": round(d["prefill_s"], 2),
        "prefills": d["prefills"],
        "queue_wait_ms": round(1000 * d["queue_wait_s"] / max(d["finished"], 1), 1),
        "other_s": round(d["busy_s"] - d["decode_s"] - d["sample_s"] - d["prefill_s"], 2),
        **{k: v for k, v in d.items() if k.startswith(("forwards_", "graph_")) and v},
        **({"graph_error": after["graph_error"]} if after.get("graph_error") else {}),
    }


def lora_step_ms(model_path: Path, adapter: Path, batch: int, context: int = 256) -> dict:
    """Best-of-N time of one decode step of `batch` rows by LoRA execution path.

    base: no adapter; merged: all rows on the adapter, merged weights (the default);
    peft: all rows on the adapter, PEFT's unmerged layers; mixed: half base, half adapter in
    one forward (PEFT `adapter_names=`); split: the same rows as two forwards, one per adapter.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from vfkit.serve.kv_cache import BatchCache
    from vfkit.serve.lora import LoraManager
    from vfkit.serve.model import choose_dtype, load_model

    managers = {}
    for merge in (True, False):
        model = load_model(AutoModelForCausalLM, model_path, choose_dtype("auto", "cpu"))
        managers[merge] = LoraManager(model.eval(), allowed_dirs=[adapter.parent], merge=merge)
        lora = managers[merge]
        lora.apply_load("a", lora.check_load("a", str(adapter), inplace=False))

    def step(lora: LoraManager, rows: list[str | None]) -> float:
        cache = BatchCache()
        ids = torch.randint(0, 1000, (len(rows), context))
        best = float("inf")
        with torch.inference_mode():
            lora.forward(rows, input_ids=ids, past_key_values=cache, logits_to_keep=1)
            for _ in range(8):
                start = time.perf_counter()
                lora.forward(rows, input_ids=ids[:, :1], past_key_values=cache, logits_to_keep=1)
                best = min(best, time.perf_counter() - start)
        return best * 1000

    half = batch // 2
    times = {
        "base": step(managers[True], [None] * batch),
        "merged": step(managers[True], ["a"] * batch),
        "peft": step(managers[False], ["a"] * batch),
    }
    if half:
        times["mixed"] = step(managers[False], [None, "a"] * half)
        times["split"] = step(managers[False], [None] * half) + step(managers[False], ["a"] * half)
    return {"batch": batch, **{f"{k}_ms": round(v, 1) for k, v in times.items()}}


def wait_for_idle(threshold: float, patience_s: float = 900.0) -> None:
    """Wait (up to `patience_s`) until the 1-minute load average drops below `threshold`."""
    deadline = time.monotonic() + patience_s
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        time.sleep(5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--base-url", help="benchmark this running server instead of starting one")
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--vary", action="store_true", help="spread max_tokens (rows end apart)")
    p.add_argument("--wait-idle", type=float, default=0.0, help="first wait for load avg < X")
    p.add_argument("--no-lora", action="store_true")
    p.add_argument("--no-http", action="store_true", help="skip the HTTP throughput runs")
    p.add_argument("--lora-paths", action="store_true", help="time one step per LoRA path")
    p.add_argument("--server-args", default="", help="extra vf-serve flags")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.wait_idle:
        wait_for_idle(args.wait_idle)
    print(f"# cores={os.cpu_count()} load={os.getloadavg()}", flush=True)
    if args.base_url:
        for c in levels:
            result = asyncio.run(
                measure(args.base_url, args.model, c, args.seconds, args.max_tokens)
            )
            print(json.dumps(result), flush=True)
        return
    from vfkit.hub import resolve_model

    path = resolve_model(args.model)
    with tempfile.TemporaryDirectory(prefix="vfkit-bench-") as tmp:
        work = Path(tmp)
        adapter = make_adapter(path, work / "adapter-r16")
        if not args.no_http:
            serve_and_measure(args, levels, work, adapter)
        if args.lora_paths:
            for batch in levels:
                print(json.dumps(lora_step_ms(path, adapter, batch)), flush=True)
    print(f"# load after={os.getloadavg()}", flush=True)


def serve_and_measure(args: argparse.Namespace, levels: list[int], work: Path, adapter: Path):
    """Start vf-serve, measure the base model, then with the adapter loaded."""
    from vfkit.serve.launcher import start_server

    with start_server(
        args.model, allowed_adapter_dirs=[work], log_path=work / "server.log",
        max_lora_rank=16, extra_args=args.server_args.split(),
    ) as server:  # fmt: skip
        runs = [("base", args.model)]
        if not args.no_lora:
            body = {"lora_name": "r16", "lora_path": str(adapter)}
            httpx.post(server.base_url + "/load_lora_adapter", json=body).raise_for_status()
            runs.append(("lora-r16", "r16"))
        for label, model in runs:
            for c in levels:
                result = asyncio.run(measure(server.base_url, model, c, args))
                print(json.dumps({"run": label, **result}), flush=True)


if __name__ == "__main__":
    main()
