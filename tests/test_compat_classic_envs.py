"""Unmodified classic verifiers (0.1.x) environment modules through vf-eval and vf-train.

The modules under tests/classic_envs/ do `import verifiers as vf`; verifiers is not installed,
so vfkit loads them through vfkit.compat. Both CLIs run as subprocesses against the scripted
TestServer (real HTTP); vf-train trains a tiny model for two steps on their token ids.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_eval_cli import read_rows

from vfkit.testing.scripted_server import TestServer

CLASSIC = Path(__file__).parent / "classic_envs"


def _responders() -> dict:
    """classic_envs/classic_responders.py's RESPONDERS (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location("classic_responders",
                                                  CLASSIC / "classic_responders.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RESPONDERS


RESPONDERS = _responders()

ENV_IDS = sorted(RESPONDERS)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None,
                                reason="a real verifiers is installed: vfkit.compat stays off")


def run_cli(module: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CLASSIC), *sys.path]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


# what each fixture's scripted replies score, per rollout of a group (see classic_responders)
EXPECTED_REWARDS = {
    # right answer + format (1 + 0.2), wrong + format (0.2), right without tags (no <answer>: 0)
    "classic-xml-qa": [1.2, 0.2, 0.0],
    "classic-guess": None,  # depends on each row's number: checked through the states below
    "classic-tools": [1.5, 0.5, 1.5],  # right answer + tool used (0.5), wrong answer + tool used
}


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_vf_eval_runs_a_classic_environment(env_id: str, tmp_path: Path) -> None:
    with TestServer(RESPONDERS[env_id]()) as srv:
        done = run_cli("vfkit.cli.eval", env_id, "-b", srv.base_url, "-m", "test-model", "-n", "2",
                       "-r", "3", "-t", "200", "-c", "1", "-o", str(tmp_path))
    assert done.returncode == 0, done.stderr
    [results] = tmp_path.glob("*/*/results.jsonl")
    rows = read_rows(results.parent)
    assert len(rows) == 6 and not any(r["error"] for r in rows)
    by_example: dict[int, list[dict]] = {}
    for row in rows:
        by_example.setdefault(row["example_id"], []).append(row)
    for group in by_example.values():
        if EXPECTED_REWARDS[env_id] is not None:
            assert sorted(r["reward"] for r in group) == pytest.approx(
                sorted(EXPECTED_REWARDS[env_id]))
    if env_id == "classic-guess":
        # answers 2, 3: "3" is right at once (1.0); for 2, "3" -> "go lower" -> "2" (1/2)
        assert [r["reward"] for r in by_example[1]] == [1.0, 1.0, 1.0]
        assert [r["reward"] for r in by_example[0]] == [0.5, 0.5, 0.5]
        assert {r["stop_condition"] for r in rows} == {"completed"}
    if env_id == "classic-tools":
        assert all(any(m["role"] == "tool" for m in r["completion"]) for r in rows)


def train_config(model: Path, env_id: str, base_url: str, out: Path) -> Path:
    config = out / "run.toml"
    config.write_text(f"""
model = "{model}"
[env]
id = "{env_id}"
[inference]
base_url = "{base_url}"
[trainer.args]
rollouts_per_example = 3
batch_size = 6
micro_batch_size = 6
max_steps = 2
max_tokens = 128
max_seq_len = 1024
max_prompt_len = 800
adapter_probe_tolerance = inf
output_dir = "{out}"
run_name = "classic"
save_steps = 100
bf16 = false
""")
    return config


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_vf_train_takes_two_steps_on_a_classic_environment(
    env_id: str, tiny_model_path: Path, tmp_path: Path
) -> None:
    with TestServer(RESPONDERS[env_id]()) as srv:
        done = run_cli("vfkit.cli.train", str(train_config(tiny_model_path, env_id,
                                                           srv.base_url, tmp_path)))
        loads = [body["lora_name"] for kind, body in srv.lora_requests if kind == "load"]
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = tmp_path / "classic"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["tokens/total"] > 0 for s in steps)  # trained on the server's token ids
    assert loads == ["classic-step1", "classic-step2"]
    assert (run_dir / "adapters" / "step_2" / "adapter_model.safetensors").exists()
