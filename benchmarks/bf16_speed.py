"""What bf16 costs or saves on this machine: one matmul, and one real vfkit training update.

    .venv/bin/python -m benchmarks.bf16_speed [--sequences 8] [--tokens 90]

Prints whether the CPU has bf16 units (vfkit/precision.py), the time of a 1024x1024 matmul in
fp32 and bf16, and the time of `Learner.update` (SmolLM2-135M-Instruct, exp.toml's LoRA, one
micro-batch of `--sequences` sequences of `--tokens` tokens) with `bf16 = false` and `true`,
each after one untimed warm-up update. The trainer's threads are the ones vf-train gives it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from vfkit.precision import cpu_supports_bf16
from vfkit.train.config_loader import load_config
from vfkit.train.learner import Learner
from vfkit.train.rundir import RunDir
from vfkit.train.samples import Sample

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "exp.toml"


def matmul_s(dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return (time.perf_counter() - started) / repeats


def samples(n: int, tokens: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    mask = [0] * 40 + [1] * (tokens - 40)  # ~40 prompt tokens, as exp.toml's arithmetic
    return [Sample(torch.randint(3, 40000, (tokens,), generator=g).tolist(), mask,
                   [-1.0 if m else 0.0 for m in mask], 1.0 if i % 2 else -1.0)
            for i in range(n)]


def update_s(bf16: bool, batch: list[Sample]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(CONFIG, [f"trainer.args.bf16={str(bf16).lower()}",
                                   f"trainer.args.batch_size={len(batch)}",
                                   f"trainer.args.micro_batch_size={len(batch)}",
                                   "trainer.args.rollouts_per_example=2",
                                   f'trainer.args.output_dir="{tmp}"'])
        learner = Learner(cfg, RunDir(Path(tmp) / "run"))
        learner.update(batch)  # warm-up
        started = time.perf_counter()
        learner.update(batch)
        return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--tokens", type=int, default=90)
    args = p.parse_args()
    print(f"bf16 units on this CPU: {cpu_supports_bf16()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    for dtype in (torch.float32, torch.bfloat16):
        print(f"matmul 1024x1024 {dtype}: {matmul_s(dtype):.3f} s")
    batch = samples(args.sequences, args.tokens)
    for bf16 in (False, True):
        print(f"Learner.update, {args.sequences} x {args.tokens} tokens, bf16={bf16}: "
              f"{update_s(bf16, batch):.1f} s", flush=True)


if __name__ == "__main__":
    main()
