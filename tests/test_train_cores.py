"""CPU cores follow the work: the trainer takes every core while the server has nothing to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from vfkit.train.cores import CoreShare
from vfkit.train.learner import Learner
from vfkit.train.rundir import RunDir
from vfkit.train.samples import Sample


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_core_share_gives_every_core_only_while_nothing_generates() -> None:
    torch.set_num_threads(2)
    busy = [True]
    cores = CoreShare(share=1, total=3, generating=lambda: busy[0])
    assert cores.fit() == 1 and torch.get_num_threads() == 1
    busy[0] = False
    assert cores.fit() == 3 and torch.get_num_threads() == 3
    assert cores.fit() == 3  # no change, no switch
    busy[0] = True
    assert cores.fit() == 1 and torch.get_num_threads() == 1
    assert cores.switches == 3  # 2 -> 1 -> 3 -> 1


def _learner(tiny_model_path: Path, tmp_path: Path, monkeypatch, *overrides: str) -> Learner:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))
    import train_testing

    # server and trainer pinned to this machine's CPU, where the cores are shared
    cfg = train_testing.tiny_config(tiny_model_path, tmp_path, "", "inference.gpus=0",
                                    "trainer.gpus=0", *overrides)
    run = RunDir(tmp_path / cfg.run_name)
    run.root.mkdir(parents=True, exist_ok=True)
    return Learner(cfg, run)


def _samples(n: int = 8) -> list[Sample]:
    ids = list(range(10, 30))
    mask = [0] * 10 + [1] * 10
    return [Sample(ids, mask, [-5.5 if m else 0.0 for m in mask], (-1.0) ** i) for i in range(n)]


def test_learner_switches_threads_per_micro_batch_with_the_generation_state(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # split: 2 for the server, 2 for us
    learner = _learner(tiny_model_path, tmp_path, monkeypatch)
    assert learner.cores is not None and (learner.cores.share, learner.cores.total) == (2, 4)
    # three pieces of work: the step's prompts once, then two micro-batches (4 samples each);
    # generation finishes after the first micro-batch
    calls = iter([True, True, False, False, False])
    learner.share_cores_with(lambda: next(calls))
    metrics = learner.update(_samples())
    assert metrics["cpu/trainer_threads"] == pytest.approx((2 + 2 + 4) / 3)
    learner.share_cores_with(lambda: False)
    assert learner.update(_samples())["cpu/trainer_threads"] == 4


def test_threads_stay_fixed_when_the_user_pins_them_or_the_server_is_remote(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    pinned = _learner(tiny_model_path, tmp_path, monkeypatch)
    assert pinned.cores is None
    assert "cpu/trainer_threads" not in pinned.update(_samples())
    monkeypatch.delenv("OMP_NUM_THREADS")
    remote = _learner(tiny_model_path, tmp_path / "r", monkeypatch,
                      'inference.base_url="http://10.0.0.7:8000/v1"')
    assert remote.cores is None  # the server's cores are not ours to take
