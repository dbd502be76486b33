"""Seconds to sample one GRPO batch (P prompts x G completions each) from vf-serve.

    flock /tmp/vfkit_heavy.lock .venv/bin/python -m benchmarks.group_batch --threads 1

What the trainer waits for each step: P training prompts of an environment (arithmetic by
default, its chat prompts) sent as P x G concurrent chat requests, as the orchestrator sends
them, with exp.toml's sampling (temperature 0.7, 48 tokens). Prints the wall seconds of each
batch and where the server spent them (GET /stats: prefill, decode, sampling), so a change to
the engine can be timed on the batches training sends, not only on `benchmarks/serve.py`'s
back-to-back streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

from benchmarks.serve import MODEL, _stats


async def one_batch(http: httpx.AsyncClient, prompts: list, args: argparse.Namespace) -> dict:
    """Send every prompt `args.group` times at once; seconds until the last reply."""
    body = {"model": args.model, "temperature": 0.7, "max_tokens": args.max_tokens}

    async def ask(messages: list, k: int) -> int:
        r = await http.post("/chat/completions", json={**body, "messages": messages, "seed": k})
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    before = await _stats(http)
    start = time.monotonic()
    jobs = [ask(m, 1000 * i + j) for i, m in enumerate(prompts) for j in range(args.group)]
    tokens = await asyncio.gather(*jobs)
    seconds = time.monotonic() - start
    after = await _stats(http)
    d = {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, int | float)}
    return {
        "seconds": round(seconds, 2),
        "completion_tokens": sum(tokens),
        "prefill_s": round(d["prefill_s"], 2),
        "prefill_tokens": d["prefill_tokens"],
        "prefills": d["prefills"],
        "decode_s": round(d["decode_s"], 2),
        "decode_steps": d["decode_steps"],
        "decode_rows": d["decode_rows"],
        "decode_slots": d["decode_slots"],
        "sample_s": round(d["sample_s"], 2),
    }


async def measure(base_url: str, batches: list[list], args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        warm = {"model": args.model, "max_tokens": 4, "messages": batches[0][0]}
        (await http.post("/chat/completions", json=warm)).raise_for_status()
        for i, prompts in enumerate(batches):
            print(json.dumps({"batch": i, **await one_batch(http, prompts, args)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--env", default="arithmetic")
    p.add_argument("--prompts", type=int, default=4, help="P: prompts a batch")
    p.add_argument("--group", type=int, default=8, help="G: completions a prompt")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--server-args", default="--dtype float32", help="extra vf-serve flags")
    args = p.parse_args()

    from vfkit.envs.registry import load_environment
    from vfkit.serve.launcher import start_server

    rows = load_environment(args.env).get_dataset(n=args.prompts * args.batches, seed=0)
    prompts = [row["prompt"] for row in rows]
    batches = [prompts[i : i + args.prompts] for i in range(0, len(prompts), args.prompts)]
    extra = [*args.server_args.split(), "--threads", str(args.threads)]
    with start_server(args.model, extra_args=extra) as server:
        asyncio.run(measure(server.base_url, batches, args))


if __name__ == "__main__":
    main()
