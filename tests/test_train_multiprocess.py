"""Two trainer processes on CPU (gloo DDP): only rank 0 talks to the server, both train, and
the result equals a one-process run (the loss normalization ignores the split)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vfkit.testing.scripted_server import TestServer

FIXTURES = Path(__file__).parent / "fixtures" / "train_envs"


def write_config(tmp_path: Path, model: Path, base_url: str, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
model = "{model}"
[env]
id = "train-letter-a"
[inference]
base_url = "{base_url}"
[trainer]
gpus = 0  # CPU processes (gloo) on any machine: two ranks cannot share one GPU under NCCL
[trainer.args]
rollouts_per_example = 4
batch_size = 8
micro_batch_size = 2
max_steps = 2
max_tokens = 8
max_seq_len = 128
max_prompt_len = 100
learning_rate = 1e-2
mask_ratio_low = 0.0
mask_ratio_high = 1e9
adapter_probe_tolerance = inf
output_dir = "{tmp_path}"
run_name = "{name}"
bf16 = false
""")
    return path


@pytest.mark.slow
def test_two_cpu_processes_match_one(tiny_model_path: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    import train_testing

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURES), *sys.path]),
           "OMP_NUM_THREADS": "1"}
    # torchrun, because `accelerate launch --cpu` starts one process; Accelerate reads the
    # same RANK / WORLD_SIZE either way
    runs = {"one": [sys.executable, "-m", "vfkit.cli.train"],
            "two": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                    "-m", "vfkit.cli.train"]}
    for name, argv in runs.items():
        with TestServer(train_testing.GroupResponder()) as srv:
            config = write_config(tmp_path, tiny_model_path, srv.base_url, name)
            proc = subprocess.run([*argv, str(config)], env=env, capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            if name == "two":
                assert "rank 1 of 2" in proc.stderr  # the follower really ran
            loads = [kind for kind, _ in srv.lora_requests if kind == "load"]
            assert len(loads) == 2  # one hot-load per step, from rank 0 only
    one = load_file(tmp_path / "one" / "checkpoints" / "step_2" / "adapter" /
                    "adapter_model.safetensors")
    two = load_file(tmp_path / "two" / "checkpoints" / "step_2" / "adapter" /
                    "adapter_model.safetensors")
    for key in one:
        torch.testing.assert_close(one[key], two[key], atol=1e-5, rtol=0)
    assert len(train_testing.metrics(tmp_path / "two")) == 2
