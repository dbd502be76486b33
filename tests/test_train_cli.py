"""vf-train as a process: one SIGINT finishes the step, checkpoints and exits 0; two stop now."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vfkit.testing.scripted_server import TestServer

FIXTURES = Path(__file__).parent / "fixtures" / "train_envs"


def start(tiny_model_path: Path, tmp_path: Path, base_url: str) -> subprocess.Popen:
    config = tmp_path / "run.toml"
    config.write_text(f"""
model = "{tiny_model_path}"
[env]
id = "train-letter-a"
[inference]
base_url = "{base_url}"
[trainer.args]
rollouts_per_example = 4
batch_size = 8
micro_batch_size = 8
max_steps = 50
max_tokens = 8
max_seq_len = 128
max_prompt_len = 100
adapter_probe_tolerance = inf
output_dir = "{tmp_path}"
run_name = "cli"
save_steps = 100
bf16 = false
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURES), *sys.path]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "vfkit.cli.train", str(config)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def wait_for_steps(run_dir: Path, proc: subprocess.Popen, steps: int) -> None:
    deadline = time.monotonic() + 120
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {steps} steps in time:\n{proc.communicate(timeout=30)[0]}")


@pytest.fixture
def responder(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    import train_testing

    return train_testing.GroupResponder()


@pytest.mark.slow
def test_one_sigint_finishes_the_step_checkpoints_and_exits_zero(
    tiny_model_path: Path, tmp_path: Path, responder
) -> None:
    with TestServer(responder) as srv:
        srv.delay_next(0.3, n=10_000)  # a step takes a while: the signal lands mid-run
        proc = start(tiny_model_path, tmp_path, srv.base_url)
        wait_for_steps(tmp_path / "cli", proc, 2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "finishing this step" in out and "stopped early" in out
    steps = len((tmp_path / "cli" / "metrics.jsonl").read_text().splitlines())
    assert 2 <= steps < 50
    assert (tmp_path / "cli" / "checkpoints" / f"step_{steps}" / "state.json").exists()


def test_second_signal_interrupts_at_once(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from vfkit.cli import train as cli
    from vfkit.train.loop import StopFlag

    old = signal.getsignal(signal.SIGINT)
    stop = StopFlag()
    try:
        cli.install_stop_handlers(stop)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested  # the first one only asks
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs before this returns
    finally:
        signal.signal(signal.SIGINT, old)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert "SIGINT: finishing this step" in capsys.readouterr().err


def test_interrupted_run_exits_130(monkeypatch, tmp_path: Path, capsys) -> None:
    from vfkit.cli import train as cli
    from vfkit.train import phases, run_checks

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(phases, "run_phase", interrupted)
    monkeypatch.setattr(run_checks, "require_static_checks", lambda *_a, **_k: None)  # model "m"
    config = tmp_path / "c.toml"
    config.write_text('model = "m"\n[env]\nid = "x"\n')
    old = {s: signal.getsignal(s) for s in cli.STOP_SIGNALS}
    try:
        assert cli.main([str(config)]) == 130
        # main in-process hands the caller its handlers back: an ignored SIGINT left here
        # would be inherited by every child a later test starts
        assert {s: signal.getsignal(s) for s in cli.STOP_SIGNALS} == old
        monkeypatch.setattr(sys, "argv", ["vf-train", str(config)])
        assert cli.entry() == 130  # the command itself exits with the signals ignored
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in cli.STOP_SIGNALS)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert "vf-train: interrupted" in capsys.readouterr().err
