"""The training loop end to end against the scripted TestServer (real HTTP, tiny model)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vfkit.errors import ConfigError, VfkitError
from vfkit.testing.scripted_server import TestServer
from vfkit.train.loop import StopFlag
from vfkit.train.phases import train

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def _helpers():
    import train_testing

    return train_testing


def adapter(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step}" / "adapter" /
                     "adapter_model.safetensors")


def rollout_ids(run_dir: Path, step: int) -> list[int]:
    path = run_dir / "rollouts" / f"step_{step}.jsonl"
    return [json.loads(line)["example_id"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("async_level", [0, 1])
def test_policy_lag_follows_async_level(tiny_model_path, tmp_path, async_level: int) -> None:
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        cfg = h.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                            f"trainer.args.async_level={async_level}")
        run_dir = train(cfg)
        asked = [r["model"] for r in srv.requests]
    rows = h.metrics(run_dir)
    versions = [m["policy/version"] for m in rows]
    lags = [m["policy/lag"] for m in rows]
    if async_level == 0:  # batch s is sampled by the adapter of step s-1: on-policy
        assert versions == [0, 1, 2, 3] and lags == [0, 0, 0, 0]
    else:  # batch s by the adapter of step s-2
        assert versions == [0, 0, 1, 2] and lags == [0, 1, 1, 1]
    # the server was asked for exactly those adapters (version 0 = the base model)
    base = asked[0]
    expected = [base if v == 0 else f"{cfg.run_name}-step{v}" for v in versions]
    assert list(dict.fromkeys(asked)) == list(dict.fromkeys(expected))


def test_full_run_hot_loads_adapters_and_writes_the_run_dir(tiny_model_path, tmp_path) -> None:
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        run_dir = train(h.tiny_config(tiny_model_path, tmp_path, srv.base_url))
        loads = [body["lora_name"] for kind, body in srv.lora_requests if kind == "load"]
        unloads = [body["lora_name"] for kind, body in srv.lora_requests if kind == "unload"]
        still_loaded = set(srv.adapters)
    name = run_dir.name
    assert loads == [f"{name}-step{v}" for v in (1, 2, 3, 4)]
    # no batch uses 1 and 2 now; 3 samples batch 5 of a run resumed with more steps
    assert set(unloads) == {f"{name}-step{v}" for v in (1, 2)}
    assert {f"{name}-step3", f"{name}-step4"} <= still_loaded
    rows = h.metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    for key in ("reward/mean", "loss", "grad_norm", "lr", "ratio/mean", "kl/mismatch", "entropy",
                "groups/kept", "tokens/total", "time/generate", "time/sync", "policy/lag"):
        assert key in rows[-1], key
    # "aaaa" scores 1, "aaab" 0.75, "ab" 0.5, "bbbbbb" 0: mean 0.5625 every step
    assert rows[0]["reward/mean"] == pytest.approx(0.5625)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2", "step_4"]
    assert len(rollout_ids(run_dir, 1)) == 8
    initial = load_file(run_dir / "checkpoints" / "step_2" / "adapter" /
                        "adapter_model.safetensors")
    final = adapter(run_dir, 4)
    assert any(not torch.equal(initial[k], final[k]) for k in final)  # the adapter learned


class StopAfter(StopFlag):
    """Requests a clean stop once `steps` lines are in metrics.jsonl (like one SIGINT)."""

    def __init__(self, run_dir: Path, steps: int, hard: bool = False) -> None:
        super().__init__()
        self.path, self.steps, self.hard = run_dir / "metrics.jsonl", steps, hard

    def __call__(self) -> bool:
        done = self.path.exists() and len(self.path.read_text().splitlines()) >= self.steps
        if done and self.hard:
            raise KeyboardInterrupt  # killed: no checkpoint for the steps after the last save
        return done


@pytest.mark.slow
@pytest.mark.parametrize("hard", [False, True], ids=["stop-after-step-3", "killed-after-step-3"])
def test_kill_and_resume_equals_an_uninterrupted_run(tiny_model_path, tmp_path, hard) -> None:
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        full = train(h.tiny_config(tiny_model_path, tmp_path / "a", srv.base_url))
    cfg = h.tiny_config(tiny_model_path, tmp_path / "b", srv.base_url)
    run_dir = tmp_path / "b" / cfg.run_name
    with TestServer(h.GroupResponder()) as srv:
        cfg = h.tiny_config(tiny_model_path, tmp_path / "b", srv.base_url)
        if hard:
            with pytest.raises(KeyboardInterrupt):
                train(cfg, stop=StopAfter(run_dir, 3, hard=True))
        else:
            train(cfg, stop=StopAfter(run_dir, 3))
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert saved == (["step_2"] if hard else ["step_2", "step_3"])
    with TestServer(h.GroupResponder()) as srv:  # a fresh server, as after a real crash
        cfg = h.tiny_config(tiny_model_path, tmp_path / "b", srv.base_url)
        resumed = train(cfg, resume=True)
    a, b = adapter(full, 4), adapter(resumed, 4)
    assert a.keys() == b.keys()
    # equal up to float summation order (the trainer's thread count follows the clock): each
    # rollout's reply follows its seed, a function of (seed, step, group, rollout), which a
    # resumed run sends again. A lost optimizer state or schedule moves it ~1e-2
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=0)
    for step in (1, 2, 3, 4):  # same data order
        assert rollout_ids(full, step) == rollout_ids(resumed, step)
    versions = [[m["step"], m["policy/version"]] for m in h.metrics(resumed)]
    assert versions == [[m["step"], m["policy/version"]] for m in h.metrics(full)]


@pytest.mark.slow
def test_a_finished_run_resumed_with_more_steps_keeps_the_lag(tiny_model_path, tmp_path) -> None:
    """4 steps, then --resume with max_steps=6: batch 5 is sampled by policy 3, as in a 6-step
    run (the last checkpoint kept no older adapter, and batch 5 fell back to the base model)."""
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        run_dir = train(h.tiny_config(tiny_model_path, tmp_path, srv.base_url))
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step_4" / "policies").iterdir()) \
        == ["step_3"]
    with TestServer(h.GroupResponder()) as srv:  # a fresh server: it must re-load policy 3
        more = h.tiny_config(tiny_model_path, tmp_path, srv.base_url, "trainer.args.max_steps=6")
        train(more, resume=True)
    versions = [[m["step"], m["policy/version"]] for m in h.metrics(run_dir)]
    assert versions == [[1, 0], [2, 0], [3, 1], [4, 2], [5, 3], [6, 4]]


@pytest.mark.slow
def test_a_resume_that_changes_a_fixed_key_is_refused_and_keeps_the_record(
    tiny_model_path, tmp_path, capsys
) -> None:
    """Resuming with another lora_rank printed a 28-line size-mismatch traceback; another
    learning_rate was silently ignored (the saved schedule won). Both rewrote config.toml."""
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        run_dir = train(h.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                                      "trainer.args.max_steps=2"))
        record = (run_dir / "config.toml").read_text()
        for change, named in [("trainer.args.lora_rank=4", "trainer.args.lora_rank = 4"),
                              ("trainer.args.learning_rate=0.5", "learning_rate = 0.5")]:
            cfg = h.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                                "trainer.args.max_steps=3", change)
            with pytest.raises(ConfigError, match="--resume") as err:
                train(cfg, resume=True)
            assert named in str(err.value) and "run_name" in str(err.value)
            assert (run_dir / "config.toml").read_text() == record
        train(h.tiny_config(tiny_model_path, tmp_path, srv.base_url, "trainer.args.max_steps=3"),
              resume=True)  # the run's own settings, more steps: resumes
        capsys.readouterr()
        train(h.tiny_config(tiny_model_path, tmp_path, srv.base_url, "trainer.args.max_steps=2"),
              resume=True)  # fewer steps than done: says so (it printed nothing)
    assert "nothing to train" in capsys.readouterr().err
    assert [m["step"] for m in h.metrics(run_dir)] == [1, 2, 3]


def test_a_server_blip_is_ridden_out_not_fatal(tiny_model_path, tmp_path) -> None:
    """32 overloaded answers (503) to the 8 rollouts of a batch: 4 tries each, all of what the
    rollout client tried before (the run stopped: "trained nothing"); now they retry as long
    as adapter loading would (sync_timeout) and the batch trains."""
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        srv.fail_next(503, n=32)
        run_dir = train(h.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                                      "trainer.args.max_steps=1", "trainer.args.async_level=0"))
        asked = len(srv.requests)
    (row,) = h.metrics(run_dir)
    assert asked >= 8 + 32  # every injected 503 was answered, and each rollout then got through
    assert row["errors"] == 0 and row["samples/trained"] > 0


def test_failed_rollouts_are_counted_and_excluded(tiny_model_path, tmp_path) -> None:
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        srv.fail_next(400, n=2)  # two rollouts of the first batch get a bad-request error
        run_dir = train(h.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                                      "trainer.args.max_steps=1", "trainer.args.async_level=0"))
    (row,) = h.metrics(run_dir)
    assert row["errors"] == 2
    assert row["samples/trained"] <= 6


def test_generation_timeout_stops_the_run_with_a_clear_error(tiny_model_path, tmp_path) -> None:
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        srv.delay_next(3.0, n=100)
        cfg = h.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                            "trainer.args.generation_timeout=0.5", "trainer.args.max_steps=1")
        with pytest.raises(VfkitError, match="generating and scoring batch 1 took over"):
            train(cfg)


def test_phases_rollout_then_update(tiny_model_path, tmp_path) -> None:
    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        cfg = h.tiny_config(tiny_model_path, tmp_path, srv.base_url, "trainer.args.max_steps=2")
        from vfkit.train.phases import collect_rollouts

        run_dir = collect_rollouts(cfg)
        assert srv.lora_requests == []  # sampling only, with the base model
    assert [len(rollout_ids(run_dir, s)) for s in (1, 2)] == [8, 8]
    assert not (run_dir / "checkpoints" / "step_2").exists()
    # off-line: the server is gone, the update phase does not need it
    cfg = h.tiny_config(tiny_model_path, tmp_path, "http://127.0.0.1:9/v1",
                        "trainer.args.max_steps=2")
    train(cfg, saved_batches=True)
    rows = h.metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2] and rows[-1]["samples/trained"] == 8
    assert (run_dir / "checkpoints" / "step_2" / "adapter").is_dir()
    assert (run_dir / "adapters" / "step_2" / "adapter_model.safetensors").exists()


def test_rollout_phase_resumes_after_its_last_file(tiny_model_path, tmp_path) -> None:
    from vfkit.train.phases import collect_rollouts

    h = _helpers()
    with TestServer(h.GroupResponder()) as srv:
        cfg = h.tiny_config(tiny_model_path, tmp_path, srv.base_url, "trainer.args.max_steps=1")
        run_dir = collect_rollouts(cfg)
        first = (run_dir / "rollouts" / "step_1.jsonl").read_text()
        more = h.tiny_config(tiny_model_path, tmp_path, srv.base_url, "trainer.args.max_steps=3")
        with pytest.raises(VfkitError, match="--resume"):
            collect_rollouts(more)
        collect_rollouts(more, resume=True)
        asked = len(srv.requests)
    assert (run_dir / "rollouts" / "step_1.jsonl").read_text() == first
    assert [len(rollout_ids(run_dir, s)) for s in (2, 3)] == [8, 8]
    assert asked == 3 * 8  # step 1 was not sampled again


def test_update_phase_without_rollouts_says_what_to_run(tiny_model_path, tmp_path) -> None:
    cfg = _helpers().tiny_config(tiny_model_path, tmp_path, "http://127.0.0.1:9/v1")
    with pytest.raises(VfkitError, match="--phase rollout"):
        train(cfg, saved_batches=True)


def test_a_second_trainer_on_the_same_run_is_refused_and_changes_nothing(
    tiny_model_path, tmp_path
) -> None:
    from vfkit.runlock import RunLock, RunLockedError

    h = _helpers()
    cfg = h.tiny_config(tiny_model_path, tmp_path, "http://127.0.0.1:9/v1")
    run_dir = tmp_path / cfg.run_name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    with RunLock(run_dir), pytest.raises(RunLockedError, match=str(os.getpid())):
        train(cfg, resume=True)  # another vf-train --resume holds the run
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'
