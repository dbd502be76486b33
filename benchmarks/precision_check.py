"""How much of a LoRA adapter's change of the policy survives a bf16 forward?

    flock /tmp/vfkit_heavy.lock .venv/bin/python -m benchmarks.precision_check \
        --run outputs/early/default-seeds/reverse-text/seed2/vfkit/run \
        --adapter outputs/early/default-seeds/reverse-text/seed2/vfkit/snapshots/step10 --step 12

An adapter moves the policy by small changes to every linear layer's output. In bf16 each such
output is rounded to 8 mantissa bits, and PEFT adds the LoRA term to the base layer's output
after that rounding, so a term below half a bf16 step is rounded away. This measures the effect
on the policy: on the completions a training run recorded at `--step` (`rollouts/step_N.jsonl`),
the exact per-token KL divergence (full vocabulary, at the run's temperature) between

- the adapter and the base model, both in fp32 (how far the update moved the policy),
- the same two in bf16, as vf-serve serves them (weights cast to bf16, LoRA unmerged) and under
  bf16 autocast with fp32 weights, as the trainer computes them,
- the adapter in fp32 and in each bf16 form (what the bf16 policy misses).

A bf16 sampler that keeps the update would move as far as fp32 does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def completions(run: Path, step: int) -> tuple[list[tuple[list[int], list[int]]], float]:
    """(prompt ids, completion ids) of each rollout of `step`, and the run's temperature."""
    import tomllib

    from vfkit.train.data import read_rollouts
    from vfkit.train.rundir import RunDir

    groups, _ = read_rollouts(RunDir(run).rollouts_file(step))
    pairs = [(t["prompt_ids"], t["completion_ids"])
             for t in (state["trajectory"][-1]["tokens"] for group in groups for state in group)]
    config = tomllib.loads(RunDir(run).config.read_text())
    return pairs, float(config["trainer"]["args"]["temperature"])


@torch.no_grad()
def log_probs(model, pairs, temperature: float, autocast: bool) -> list[torch.Tensor]:
    """Log-softmax over the vocabulary at each completion position (fp32), one row per pair."""
    out = []
    context = (torch.autocast("cpu", dtype=torch.bfloat16) if autocast
               else contextlib.nullcontext())
    with context:
        for prompt, completion in pairs:
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            out.append(torch.log_softmax(logits / temperature, dim=-1))
    return out


def mean_kl(p: list[torch.Tensor], q: list[torch.Tensor]) -> float:
    """Mean over completion tokens of KL(p ‖ q), exact over the vocabulary."""
    total = sum(float((a.exp() * (a - b)).sum()) for a, b in zip(p, q, strict=True))
    return total / sum(len(a) for a in p)


def main() -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from vfkit.train.policy import resolve_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a vf-train run folder")
    parser.add_argument("--adapter", type=Path, required=True, help="a LoRA adapter folder")
    parser.add_argument("--step", type=int, required=True, help="whose rollouts to score")
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args()

    pairs, temperature = completions(args.run, args.step)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(args.model),
                                                 dtype=torch.float32).eval()
    base = {"fp32": log_probs(model, pairs, temperature, autocast=False),
            "autocast": log_probs(model, pairs, temperature, autocast=True)}
    model = PeftModel.from_pretrained(model, args.adapter).eval()
    adapted = {"fp32": log_probs(model, pairs, temperature, autocast=False),
               "autocast": log_probs(model, pairs, temperature, autocast=True)}
    model = model.to(torch.bfloat16)
    adapted["bf16"] = log_probs(model, pairs, temperature, autocast=False)
    with model.disable_adapter():
        base["bf16"] = log_probs(model, pairs, temperature, autocast=False)
    report = {
        "tokens": sum(len(c) for _, c in pairs),
        "moved": {k: round(mean_kl(adapted[k], base[k]), 5) for k in ("fp32", "bf16", "autocast")},
        "missed": {k: round(mean_kl(adapted["fp32"], adapted[k]), 5) for k in ("bf16", "autocast")},
        "base_rounding": {k: round(mean_kl(base["fp32"], base[k]), 5)
                          for k in ("bf16", "autocast")},
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
