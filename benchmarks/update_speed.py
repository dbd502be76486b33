"""Seconds per optimizer step of the learner on a fixed exp.toml-shaped batch.

    python -m benchmarks.update_speed --threads 2 --repeats 3

4 prompts of 36-44 tokens with 8 completions each of 5-48 tokens (random ids, seeded; the
shape of exp.toml's batch), the config's LoRA and loss, the importance-ratio mask opened so
every token carries gradient. `--set shared_prompt_forward=false` for the unshared forward.
No server and no sampling: what one `policy_update` costs on this machine, to compare code
versions (run it at each commit) without a race's noise.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from accelerate import Accelerator
from transformers import get_scheduler

from vfkit.train.config_loader import load_config
from vfkit.train.learner import build_optimizer
from vfkit.train.policy import load_policy, resolve_model_dir
from vfkit.train.samples import Sample
from vfkit.train.update import policy_update


def batch(seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for _ in range(4):
        prompt = [rng.randrange(1000, 40000) for _ in range(rng.randint(36, 44))]
        for _ in range(8):
            completion = [rng.randrange(1000, 40000) for _ in range(rng.randint(5, 48))]
            mask = [0] * len(prompt) + [1] * len(completion)
            samples.append(Sample(prompt + completion, mask, [-1.0 * m for m in mask],
                                  rng.choice([-1.0, 1.0])))
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default="configs/exp.toml")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=BOOL",
                   help="trainer.args booleans to override, e.g. shared_prompt_forward=false")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    cfg = load_config(a.config)
    update = {"mask_ratio_low": 0.0, "mask_ratio_high": 1e30}
    update |= {k: v.lower() == "true" for k, v in (item.split("=", 1) for item in a.set)}
    args = cfg.trainer.args.model_copy(update=update)
    model, _ = load_policy(resolve_model_dir(cfg.model), args)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    optimizer = build_optimizer(model, args)
    model, optimizer = accelerator.prepare(model, optimizer)
    scheduler = get_scheduler("constant", optimizer)
    samples = batch()
    for _ in range(a.repeats):
        started = time.perf_counter()
        out = policy_update(model, optimizer, scheduler, accelerator, samples, args, 0)
        print(f"threads {a.threads}: {time.perf_counter() - started:.2f} s "
              f"(grad norm {out['grad_norm']:.6f})", flush=True)


if __name__ == "__main__":
    main()
