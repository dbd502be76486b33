"""Checkpoints: atomic write, pruning, exact restore of adapter, optimizer, schedule and RNG."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, get_scheduler

from vfkit.errors import VfkitError
from vfkit.train.checkpoint import (
    find_checkpoint,
    load_checkpoint,
    policy_dirs,
    save_checkpoint,
)
from vfkit.train.rundir import RunDir


def setup(model_path: Path, seed: int):
    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path),
                           LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    sched = get_scheduler("linear", opt, num_warmup_steps=1, num_training_steps=10)
    return model, opt, sched


def step(model, opt, sched) -> None:
    ids = torch.randint(3, 200, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def test_save_and_restore_is_exact(tiny_model_path: Path, tmp_path: Path) -> None:
    model, opt, sched = setup(tiny_model_path, seed=0)
    step(model, opt, sched)
    policy = tmp_path / "old_policy"
    model.save_pretrained(policy)
    path = save_checkpoint(RunDir(tmp_path), 1, model=model, optimizer=opt, scheduler=sched,
                           state={"policy_version": 1, "data_cursor": 2}, policies={7: policy},
                           total_limit=0)
    expected_rng = (random.random(), np.random.rand(), torch.rand(1))
    step(model, opt, sched)  # what an uninterrupted run does next
    expected = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    other, opt2, sched2 = setup(tiny_model_path, seed=1)  # a fresh process, other init
    state = load_checkpoint(path, model=other, optimizer=opt2, scheduler=sched2)
    assert state == {"step": 1, "policy_version": 1, "data_cursor": 2}
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected_rng
    step(other, opt2, sched2)
    for name, p in other.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p, expected[name], atol=1e-6, rtol=0)
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert sorted(policy_dirs(path)) == [1, 7]


def test_prune_and_find_latest(tiny_model_path: Path, tmp_path: Path) -> None:
    model, opt, sched = setup(tiny_model_path, seed=0)
    for s in (1, 2, 3):
        save_checkpoint(RunDir(tmp_path), s, model=model, optimizer=opt, scheduler=sched,
                        state={"policy_version": s}, policies={}, total_limit=2)
    assert [p.name for p in RunDir(tmp_path).list_checkpoints()] == ["step_2", "step_3"]
    run = RunDir(tmp_path)
    assert find_checkpoint(run, None).name == "step_3"
    assert find_checkpoint(run, str(run.checkpoint_dir(2))).name == "step_2"
    assert find_checkpoint(run, str(tmp_path)).name == "step_3"  # a run dir: its latest


def test_partial_checkpoints_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / ".step_5.tmp").mkdir(parents=True)  # killed while writing
    (tmp_path / "checkpoints" / "step_4").mkdir()  # no state.json: not complete
    assert RunDir(tmp_path).list_checkpoints() == []
    with pytest.raises(VfkitError, match="no checkpoint under"):
        find_checkpoint(RunDir(tmp_path), None)


def test_a_full_disk_is_named_and_leaves_the_last_checkpoint_whole(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while writing a checkpoint ended the run with torch.save's traceback."""
    import errno

    from vfkit.train.rundir import writing

    model, opt, sched = setup(tiny_model_path, seed=0)
    run = RunDir(tmp_path)
    kept = save_checkpoint(run, 1, model=model, optimizer=opt, scheduler=sched,
                           state={"policy_version": 1}, policies={}, total_limit=0)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)  # the disk fills up during the next checkpoint
    with pytest.raises(VfkitError) as err, writing("the checkpoint", run.checkpoint_dir(2)):
        save_checkpoint(run, 2, model=model, optimizer=opt, scheduler=sched,
                        state={"policy_version": 2}, policies={}, total_limit=0)
    assert "disk is full" in str(err.value) and "--resume" in str(err.value)
    assert str(run.checkpoint_dir(2)) in str(err.value)
    assert run.list_checkpoints() == [kept]
    assert not any(p.name.endswith(".tmp") for p in run.checkpoints.iterdir())  # room given back
