"""`vf-rl --dry-run`: passes on a good config, and names the problem on each bad one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from test_rl_helpers import vfrl, write_config


@pytest.fixture
def config(tmp_path: Path, tiny_model_path: Path) -> Path:
    return write_config(tmp_path, tiny_model_path)


@pytest.mark.slow
def test_good_config_passes_and_prints_the_plan(tmp_path: Path, config: Path) -> None:
    out = vfrl(tmp_path, "--dry-run", str(config))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks passed" in out.stdout
    assert "✗" not in out.stdout
    assert "targets q_proj, v_proj found" in out.stdout
    assert "rl-echo: 16 examples" in out.stdout
    assert "per step   4 rollouts = 2 prompts × 2; 2 micro-batch(es) of 2" in out.stdout
    assert "foreground: stdout is not a terminal" in out.stdout
    assert "tokens     ≤" in out.stdout
    assert "precision  trainer fp32" in out.stdout  # the config's bf16 = false
    assert not (tmp_path / "outputs").exists()  # a dry run writes nothing


@pytest.mark.slow
def test_dynamic_sampling_is_in_the_plan_and_needs_the_filter(tmp_path: Path, config: Path) -> None:
    out = vfrl(tmp_path, "--dry-run", str(config), "trainer.args.dynamic_sampling_rounds=2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "flat groups resampled up to 2 more round(s)" in out.stdout
    bad = vfrl(tmp_path, "--dry-run", str(config), "trainer.args.dynamic_sampling_rounds=2",
               "trainer.args.filter_zero_advantage=false")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "trainer.args.dynamic_sampling_rounds" in bad.stderr
    assert "filter_zero_advantage = true" in bad.stderr


def test_bad_key_names_the_key_and_the_nearest_one(tmp_path: Path, config: Path) -> None:
    out = vfrl(tmp_path, "--dry-run", str(config), "trainer.args.learning_rat=1e-4")
    assert out.returncode != 0
    assert "learning_rat" in out.stderr and "learning_rate" in out.stderr


def _fails(tmp_path: Path, config: Path, *overrides: str) -> str:
    out = vfrl(tmp_path, "--dry-run", str(config), *overrides)
    assert out.returncode == 1, out.stdout + out.stderr
    failed = [line for line in out.stdout.splitlines() if line.startswith("✗")]
    assert len(failed) == 1, out.stdout  # exactly the problem we made
    assert "1 problem(s)" in out.stdout
    return failed[0]


@pytest.mark.slow
def test_missing_environment(tmp_path: Path, config: Path) -> None:
    line = _fails(tmp_path, config, "env.id=no-such-env")
    assert "environment" in line and "'no-such-env' not found" in line and "vf-install" in line


@pytest.mark.slow
def test_wrong_lora_target_module(tmp_path: Path, config: Path) -> None:
    line = _fails(tmp_path, config, 'trainer.args.lora_target_modules=["q_projj"]')
    assert "lora_target_modules" in line and "'q_projj'" in line
    assert "did you mean 'q_proj'" in line


@pytest.mark.slow
def test_busy_port(tmp_path: Path, config: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _fails(tmp_path, config, f"inference.port={port}")
    assert f"inference.port={port}" in line and "in use" in line


@pytest.mark.slow
def test_unwritable_output_dir(tmp_path: Path, config: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # root can write anywhere, but not under a file
    line = _fails(tmp_path, config, f"trainer.args.output_dir={blocker}/outputs")
    assert "output dir" in line and f"{blocker} is not a folder" in line


@pytest.mark.slow
def test_a_fresh_run_over_checkpoints_fails_before_anything_starts(
    tmp_path: Path, config: Path
) -> None:
    """The dry run said "all checks passed", then vf-rl started the server and only the
    trainer refused the folder."""
    step = tmp_path / "outputs" / "rl" / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    (step / "state.json").write_text("{}")  # what marks a checkpoint complete
    line = _fails(tmp_path, config)
    assert "already holds checkpoints" in line and "--resume" in line
    resumed = vfrl(tmp_path, "--dry-run", str(config), "--resume")
    assert "resume rl" in resumed.stdout and "already holds" not in resumed.stdout
    run = vfrl(tmp_path, str(config), "--no-tmux", timeout=120)
    assert run.returncode != 0 and "already holds checkpoints" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "outputs" / "rl" / "logs" / "server.log").exists()  # nothing started


def test_gpu_config_plan_splits_devices_and_batches() -> None:
    from vfkit.launch.plan import make_plan
    from vfkit.train.config_loader import load_config

    config = Path(__file__).parents[1] / "configs" / "gpu.toml"
    cfg = load_config(config)
    plan = make_plan(cfg, config, [])
    assert plan.server_devices == [0, 1] and plan.trainer.devices == [2, 3]
    assert plan.world_size == 2
    assert plan.micro_batches_per_step == 8  # 256 rollouts / (16 per micro-batch × 2 processes)
    assert plan.prompts_per_step == 16


@pytest.mark.parametrize(("tp", "ok"), [(1, None), (2, True), (4, True), (3, False)])
def test_tensor_parallel_must_divide_the_heads(tp: int, ok: bool | None) -> None:
    from types import SimpleNamespace

    from vfkit.launch.preflight import ModelInfo, check_tensor_parallel
    from vfkit.train.config_loader import parse_config

    cfg = parse_config(
        'model = "m"\n[env]\nid = "e"\n[inference]\nbackend = "builtin"\n'
        f"[inference.args]\ntensor_parallel_size = {tp}\n"
    )
    info = ModelInfo(SimpleNamespace(num_attention_heads=16, num_key_value_heads=8), None, "m")
    check = check_tensor_parallel(cfg, info, backend="vllm")
    assert (check.ok if check else None) == ok
    if ok is False:
        assert "tensor_parallel_size=3" in check.detail and "16 attention heads" in check.detail
