"""Does vf-serve sample what `transformers`' `generate` samples? The same prompts through both.

    flock /tmp/vfkit_heavy.lock .venv/bin/python -m benchmarks.sampling_check --prompts 128

The race's TRL leg samples with `model.generate` in its training process; vfkit samples from
vf-serve through the `openai` client. This draws `--n` completions of each of the first
`--prompts` training prompts of an environment from both, with one set of sampling args
(temperature, max_tokens), from the base model or `--adapter`, and scores them with the
environment's rubric (the race's scorer). If the two engines sample one distribution, the mean
reward, the share of truncated completions, the mean length and the share of all-equal groups
agree within their standard errors; the JSON printed last lists both sides and the differences
in standard errors. With one engine (`--engines generate`) it compares adapters instead: the
same sampler, one adapter per run (e.g. vfkit's and TRL's after the same number of steps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
from pathlib import Path
from typing import Any

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def hf_samples(model_dir: Path, rows: list[dict], n: int, temperature: float, max_tokens: int,
               dtype: str, seed: int, adapter: Path | None) -> list[tuple[str, int, bool]]:
    """(text, completion tokens, truncated) per sample, `generate` on left-padded batches."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).eval()
    eos = set(model.generation_config.eos_token_id if isinstance(
        model.generation_config.eos_token_id, list) else [model.generation_config.eos_token_id])
    out: list[tuple[str, int, bool]] = []
    for start in range(0, len(rows), 16):
        texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False,
                                               add_generation_prompt=True)
                 for r in rows[start : start + 16]]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            ids = model.generate(**batch, do_sample=True, temperature=temperature, top_p=1.0,
                                 top_k=0, max_new_tokens=max_tokens, num_return_sequences=n,
                                 pad_token_id=tokenizer.pad_token_id)
        for seq in ids[:, batch["input_ids"].shape[1]:].tolist():
            end = next((i + 1 for i, t in enumerate(seq) if t in eos), None)
            kept = seq[:end] if end else seq
            out.append((tokenizer.decode(kept, skip_special_tokens=True), len(kept), end is None))
    return out


def server_samples(model_dir: Path, rows: list[dict], n: int, temperature: float,
                   max_tokens: int, dtype: str, adapter: Path | None,
                   concurrency: int = 4) -> list[tuple[str, int, bool]]:
    """(text, completion tokens, truncated) per sample, from a builtin vf-serve via `openai`
    (`adapter` hot-loaded as vf-train does, through the runtime-LoRA route)."""
    import openai

    from vfkit.serve.launcher import start_server
    from vfkit.train.adapter_sync import AdapterSync

    async def draw(client: openai.AsyncOpenAI, gate: asyncio.Semaphore, row: dict) -> Any:
        async with gate:
            return await client.chat.completions.create(
                model=served, messages=row["prompt"], n=n, temperature=temperature,
                max_tokens=max_tokens, extra_body={"return_token_ids": True})

    async def draw_all(base_url: str) -> list[Any]:
        if adapter is not None:
            sync = AdapterSync(base_url)
            await sync.load(served, adapter)
            await sync.aclose()
        gate = asyncio.Semaphore(concurrency)  # the trainer's batch: `concurrency` groups at once
        async with openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY") as client:
            return await asyncio.gather(*(draw(client, gate, row) for row in rows))

    served = str(model_dir) if adapter is None else "policy"
    allowed = [] if adapter is None else [adapter.parent]
    with start_server(str(model_dir), dtype=dtype, allowed_adapter_dirs=allowed) as server:
        responses = asyncio.run(draw_all(server.base_url))
    out: list[tuple[str, int, bool]] = []
    for resp in responses:  # token_ids: vLLM's and vf-serve's extra field, per choice
        out += [(c.message.content or "", len(c.token_ids), c.finish_reason == "length")
                for c in resp.choices]
    return out


def summarize(env: Any, rows: list[dict], samples: list[tuple[str, int, bool]], n: int) -> dict:
    """Mean reward, truncated share, mean length, all-equal group share; each with its SE."""
    from benchmarks.race.rewards import score_completions

    repeated = [row for row in rows for _ in range(n)]
    completions = [[{"role": "assistant", "content": text}] for text, _, _ in samples]
    scores = score_completions(env.rubric, repeated, completions, n)
    task = env.rubric.get_reward_func_names()[0]
    rewards = [s.metrics[task] for s in scores]
    equal = [float(len(set(rewards[i : i + n])) == 1) for i in range(0, len(rewards), n)]
    columns = {"reward": rewards, "truncated": [float(t) for _, _, t in samples],
               "length": [float(k) for _, k, _ in samples], "equal_groups": equal}
    return {name: {"mean": statistics.fmean(v), "se": statistics.stdev(v) / math.sqrt(len(v))}
            for name, v in columns.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sampling_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="reverse-text")
    p.add_argument("--env-args", help="JSON (default: the race's args for --env)")
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--n", type=int, default=8, help="completions per prompt (a group)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--hf-dtype", default="float32", help="TRL's race leg trains fp32 weights")
    p.add_argument("--server-dtype", default="bfloat16", help="vf-train's default with bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adapter", type=Path, help="a LoRA adapter folder both engines sample with")
    p.add_argument("--engines", nargs="+", choices=("vf-serve", "generate"),
                   default=["vf-serve", "generate"])
    args = p.parse_args(argv)

    from benchmarks.race.settings import RACE_ENV_ARGS
    from vfkit.envs.registry import load_environment
    from vfkit.train.policy import resolve_model_dir

    env_args = RACE_ENV_ARGS.get(args.env, {}) if args.env_args is None else json.loads(
        args.env_args)
    env = load_environment(args.env, **env_args)
    rows = list(env.get_dataset())[: args.prompts]
    model_dir = resolve_model_dir(MODEL)
    sampling = (args.n, args.temperature, args.max_tokens)
    adapter = args.adapter.resolve() if args.adapter else None
    draw = {
        "vf-serve": lambda: server_samples(model_dir, rows, *sampling, args.server_dtype, adapter),
        "generate": lambda: hf_samples(model_dir, rows, *sampling, args.hf_dtype, args.seed,
                                       adapter),
    }
    sides = {name: summarize(env, rows, draw[name](), args.n) for name in args.engines}
    if len(sides) == 2:
        a, b = sides["vf-serve"], sides["generate"]
        sides["difference_in_se"] = {
            k: round((a[k]["mean"] - b[k]["mean"]) / (math.hypot(a[k]["se"], b[k]["se"])
                                                      or math.inf), 2)
            for k in a}
    print(json.dumps({"args": vars(args), **sides}, indent=1, default=str))


if __name__ == "__main__":
    main()
