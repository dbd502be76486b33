"""Training through the real embedded server: adapters hot-loaded and verified every step, and
a tiny random model learning a trivially learnable reward."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from vfkit.train.phases import train
from vfkit.train.placement import cpu_threads

torch.set_num_threads(1)

LORA_WITH_HEAD = '["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj","lm_head"]'


@pytest.mark.slow
def test_tiny_model_learns_a_trivial_reward_through_the_embedded_server(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))
    import train_testing

    # reward = share of "a" characters in the answer; the random model writes ~1 in 259.
    # lm_head gets a LoRA too: the tiny model's small output layer cannot favour one token alone
    cfg = train_testing.tiny_config(
        tiny_model_path, tmp_path, "",
        'inference.args={dtype = "float32", threads = 1}',
        "trainer.args.rollouts_per_example=8", "trainer.args.batch_size=32",
        "trainer.args.micro_batch_size=32", "trainer.args.max_tokens=6",
        "trainer.args.max_steps=60", "trainer.args.learning_rate=5e-3",
        "trainer.args.save_steps=0", "trainer.args.mask_ratio_low=0.125",
        "trainer.args.mask_ratio_high=8.0", "trainer.args.adapter_probe_tolerance=1e-3",
        f"trainer.args.lora_target_modules={LORA_WITH_HEAD}",
    )
    run_dir = train(cfg, stop=train_testing.StopWhenLearned(tmp_path / cfg.run_name, 0.8))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["reward/mean"] < 0.1  # near 0 at the start
    assert min(m["reward/mean"] for m in rows[-3:]) > 0.8, [m["reward/mean"] for m in rows]
    assert len(rows) < 60  # learned within the step budget
    # every step's adapter was hot-loaded, listed, and proven to be the trained weights
    assert all(m["sync/fingerprint_ok"] == 1.0 for m in rows)
    assert [m["policy/lag"] for m in rows[1:]] == [1] * (len(rows) - 1)
    if cpu_threads(cfg):  # trainer and server share this CPU: 1 thread while it generates
        assert all(1 <= m["cpu/trainer_threads"] <= (os.cpu_count() or 1) for m in rows)
    else:  # on a GPU the cores are not split
        assert not any("cpu/trainer_threads" in m for m in rows)
    assert (run_dir / "checkpoints" / f"step_{len(rows)}" / "adapter").is_dir()


class KillServerAfter:
    """A stop flag that never stops, but SIGKILLs the run's builtin server once `steps` steps
    are in metrics.jsonl."""

    def __init__(self, run_dir: Path, steps: int) -> None:
        self.path, self.steps, self.killed = run_dir / "metrics.jsonl", steps, []

    def __call__(self) -> bool:
        import psutil

        done = self.path.exists() and len(self.path.read_text().splitlines()) >= self.steps
        if done and not self.killed:
            for child in psutil.Process().children(recursive=True):
                if "vfkit.cli.serve" in " ".join(child.cmdline()):
                    child.kill()
                    self.killed.append(child.pid)
        return False


@pytest.mark.slow
def test_a_builtin_server_that_dies_is_started_again_and_the_run_finishes(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vf-train's own server killed after step 1: it retried for 2 minutes, then stopped and
    lost the steps since the last checkpoint. Now the server is started again on its port, the
    adapters it lost are loaded again, and all 4 steps train."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))
    import train_testing

    cfg = train_testing.tiny_config(
        tiny_model_path, tmp_path, "", 'inference.args={dtype = "float32", threads = 1}',
        "trainer.args.save_steps=0", "trainer.args.async_level=0",
    )
    killer = KillServerAfter(tmp_path / cfg.run_name, 1)
    run_dir = train(cfg, stop=killer)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert killer.killed and [m["step"] for m in rows] == [1, 2, 3, 4]
    assert all(m["errors"] == 0 for m in rows)
    assert all(m["sync/fingerprint_ok"] == 1.0 for m in rows)
