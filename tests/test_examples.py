"""The scripts in examples/ run (against the scripted test server) and their configs validate."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

from vfkit.testing.child_env import child_env
from vfkit.testing.scripted_server import TestServer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_custom_rubric_example_scores_four_replies() -> None:
    lines = run_example("custom_rubric.py").splitlines()
    # each rollout prints "reward R ..." then its reply; replies reach rollouts in arrival order
    rewards = {
        reply.strip(): float(line.split()[1])
        for line, reply in itertools.pairwise(lines)
        if line.startswith("reward")
    }
    assert len(rewards) == 4
    tagged_paris = [r for text, r in rewards.items() if "<answer>Paris</answer>" in text]
    others = [r for text, r in rewards.items() if "<answer>Paris</answer>" not in text]
    assert len(tagged_paris) == 2 and min(tagged_paris) > max(others)  # right answers score higher


def test_multiturn_example_solves_every_word() -> None:
    lines = run_example("multiturn_env.py").splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("crane: reward 1.50 in 1 turns")  # first guess: 1.0 + 0.5 / 1
    assert all(" reward 1." in ln for ln in lines)


def test_evaluate_example_against_an_endpoint() -> None:
    env_dir = str(Path(__file__).resolve().parents[1] / "environments" / "reverse-text")
    with TestServer("<answer>x</answer>") as server:
        out = subprocess.run(
            [sys.executable, str(EXAMPLES / "evaluate_env.py"), "--env", "reverse-text",
             "--base-url", server.base_url, "--model", "m", "-n", "2", "-r", "2"],
            capture_output=True, text=True, timeout=120,
            env=child_env(env_dir),
        )
    assert out.returncode == 0, out.stderr
    assert "reverse-text: 4 rollouts, reward" in out.stdout
    assert "format_reward_func" in out.stdout


def test_train_example_config_validates() -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import train_tiny
    finally:
        sys.path.remove(str(EXAMPLES))
    from vfkit.train.config_loader import parse_config

    cfg = parse_config(train_tiny.CONFIG, overrides=["trainer.args.max_steps=2"])
    assert cfg.env.id == "arithmetic" and cfg.trainer.args.max_steps == 2
