"""Where the server and the trainer run: `inference.gpus` / `trainer.gpus` ("auto", 0, a count,
ids) become the CUDA_VISIBLE_DEVICES each process starts with.

These run on a CPU machine: they check the environment a child is given, which is all CUDA
reads. The GPU placement itself is unverified until a GPU session runs a split config.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vfkit.cli.train import relaunch
from vfkit.errors import ConfigError, VfkitError
from vfkit.launch.plan import format_plan, make_plan
from vfkit.train.config_loader import parse_config
from vfkit.train.placement import (
    SEEN_DEVICES,
    check_one_gpu_per_rank,
    cpu_threads,
    device_ids,
    trainer_on_cpu,
    visible_devices,
)
from vfkit.train.run_checks import check_devices

BASE = 'model = "m"\n[env]\nid = "reverse-text"\n'


def cfg(*overrides: str):
    return parse_config(BASE, overrides=list(overrides))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("CUDA_VISIBLE_DEVICES", SEEN_DEVICES, "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


def child_sees() -> str | None:
    """CUDA_VISIBLE_DEVICES as a child process started now finds it."""
    code = "import json, os; print(json.dumps(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_default_is_auto_and_zero_is_the_cpu() -> None:
    assert device_ids(cfg()) == (None, None)  # auto: whatever the process finds
    assert device_ids(cfg("inference.gpus=0", "trainer.gpus=0")) == ([], [])
    assert trainer_on_cpu(cfg("trainer.gpus=0"))
    assert device_ids(cfg("inference.gpus=1", "trainer.gpus=2", "trainer.args.batch_size=16")) \
        == ([0], [1, 2])  # counts: the server's first
    assert device_ids(cfg("inference.gpus=[3]", "trainer.gpus=[5]")) == ([3], [5])
    assert device_ids(cfg('trainer.gpus="auto"', "inference.gpus=1")) == ([0], None)
    with pytest.raises(ConfigError, match=r"trainer\.gpus"):
        cfg('trainer.gpus="all"')


def test_a_server_child_sees_only_its_gpus_and_none_for_the_cpu() -> None:
    with visible_devices([]):
        assert child_sees() == ""  # inference.gpus = 0: no GPU, even on a GPU machine
    with visible_devices([1, 2]):
        assert child_sees() == "1,2"
    with visible_devices(None):
        assert child_sees() is None  # auto: inherited
    assert child_sees() is None  # restored


def test_ids_index_the_devices_the_run_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")  # a scheduler's allocation
    with visible_devices([1]):
        assert child_sees() == "5"
    with visible_devices(None):
        assert child_sees() == "4,5,6"


def test_vf_train_reexecutes_itself_seeing_only_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    argv, env = relaunch(cfg("inference.gpus=1", "trainer.gpus=1"), ["c.toml"])
    assert argv[1:] == ["-m", "vfkit.cli.train", "c.toml"]  # one GPU: no accelerate
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env[SEEN_DEVICES] == "2,3"

    argv, env = relaunch(cfg("trainer.gpus=[0, 1]", "trainer.args.batch_size=16"), ["c.toml"])
    assert argv[argv.index("--num_processes") + 1] == "2" and "accelerate.commands.launch" in argv
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"

    assert relaunch(cfg(), ["c.toml"]) is None  # auto: stays
    assert relaunch(cfg("trainer.gpus=0"), ["c.toml"]) is None  # the CPU: Accelerator(cpu=True)
    monkeypatch.setenv(SEEN_DEVICES, "2,3")
    assert relaunch(cfg("trainer.gpus=1"), ["c.toml"]) is None  # already re-executed


def test_the_server_a_pinned_trainer_starts_sees_the_runs_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vf-train re-executed on GPU 1 starts the builtin server on the run's GPU 0, not on its
    own view (where 0 would mean GPU 1)."""
    monkeypatch.setenv(SEEN_DEVICES, "unset")  # vf-train found no CUDA_VISIBLE_DEVICES
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with visible_devices([0]):
        assert child_sees() == "0"
    with visible_devices(None):
        assert child_sees() is None  # auto: every GPU, as the run found them


def test_cpu_settings_follow_the_config_not_just_the_machine() -> None:
    both_cpu = cfg("inference.gpus=0", "trainer.gpus=0")
    assert cpu_threads(both_cpu) is not None  # the core split applies
    plan = format_plan(make_plan(both_cpu, "c.toml", []), both_cpu, "foreground")
    assert "(127.0.0.1, free port, CPU)" in plan and "(CPU, 1 process)" in plan
    auto = cfg()
    assert "auto: the first GPU if any, else CPU" in format_plan(
        make_plan(auto, "c.toml", []), auto, "foreground")


def test_the_dry_run_names_ids_the_machine_lacks() -> None:
    import torch

    have = torch.cuda.device_count()
    result = check_devices(cfg(f"trainer.gpus=[{have}]"))
    assert not result.ok and f"use ids below {have}" in result.detail
    assert check_devices(cfg("inference.gpus=0", "trainer.gpus=0")).detail == "CPU only"


def test_two_ranks_on_one_gpu_are_refused_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL's own error for this ("Duplicate GPU detected") comes from deep inside DDP."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(VfkitError, match=r"2 trainer processes .* 1 GPU\(s\).*gpus = 0"):
        check_one_gpu_per_rank(on_cpu=False)
    check_one_gpu_per_rank(on_cpu=True)  # CPU ranks (gloo) share a machine fine
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    check_one_gpu_per_rank(on_cpu=False)
