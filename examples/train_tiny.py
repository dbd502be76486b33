"""A tiny RL training run from Python: a LoRA on SmolLM2-135M learns arithmetic, on CPU.

    python examples/train_tiny.py                                  # 4 steps, a few minutes
    python examples/train_tiny.py trainer.args.max_steps=20 env.id=reverse-text

The same TOML `vf-train` reads, given as a string; command-line arguments are overrides
(`key.path=value`). `train` starts the embedded inference server, runs the loop (rollouts one
step off-policy, GRPO loss, the adapter hot-loaded into the server after every step) and returns
the run directory, where metrics.jsonl has one line per step.
"""

from __future__ import annotations

import json
import sys

from vfkit.train.config_loader import parse_config
from vfkit.train.phases import train

CONFIG = """
model = "HuggingFaceTB/SmolLM2-135M-Instruct"

[env]
id = "arithmetic"

[inference]
backend = "builtin"

[trainer.args]
run_name = "train-tiny"
max_steps = 4
rollouts_per_example = 4
batch_size = 16
micro_batch_size = 8
max_tokens = 32
max_seq_len = 192
max_prompt_len = 128
temperature = 1.0
learning_rate = 2e-4
lora_rank = 8
lora_alpha = 16
eval_steps = 0
save_steps = 0
"""


def main(overrides: list[str]) -> None:
    cfg = parse_config(CONFIG, name="train_tiny.py", overrides=overrides)
    run_dir = train(cfg)
    print(f"run directory: {run_dir}")
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        print(f"step {m['step']:>3}  reward {m.get('reward/mean', float('nan')):.3f}  "
              f"loss {m.get('loss', float('nan')):+.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
