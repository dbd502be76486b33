"""`vf-rl` end to end with the real embedded server and vf-train on a tiny model.

Each way of running and stopping ends as documented, with no process of the run left behind
(every descendant of vf-rl is recorded while it runs, then checked after it exits).
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_rl_helpers import Tracked, vfrl_env, wait_for, write_config

pytestmark = pytest.mark.slow


def _start(tmp: Path, config: Path, *args: str) -> Tracked:
    argv = [sys.executable, "-m", "vfkit.cli.rl", str(config), *args]
    return Tracked(argv, env=vfrl_env(tmp), cwd=tmp)


def _steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _state(run: Path) -> dict:
    try:
        return json.loads((run / ".vfrl" / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def test_foreground_run_end_to_end(tmp_path: Path, tiny_model_path: Path) -> None:
    config = write_config(tmp_path, tiny_model_path, steps=3, eval_steps=2)
    run = _start(tmp_path, config)
    code, out = run.finish()
    assert code == 0, out
    root = tmp_path / "outputs" / "rl"
    assert _steps(root) == [0, 1, 2, 3]  # eval at start (step 0), then 3 steps
    assert "[server]" in out and "[trainer]" in out and "[vf-rl]" in out  # prefixed streams
    assert "run finished" in out
    assert "Uvicorn running" in (root / "logs" / "server.log").read_text()
    assert "vf-train: done" in (root / "logs" / "trainer.log").read_text()
    assert (root / "adapters" / "step_3" / "adapter_config.json").exists()
    assert (root / "report.html").exists() and (root / "report" / "reward.png").exists()
    assert _state(root)["phase"] == "done" and _state(root)["exit_code"] == 0
    assert run.orphans() == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_one_stop_signal_checkpoints_and_exits_0(
    tmp_path: Path, tiny_model_path: Path, sig: int
) -> None:
    config = write_config(tmp_path, tiny_model_path, steps=200)
    root = tmp_path / "outputs" / "rl"
    run = _start(tmp_path, config)
    wait_for(lambda: len(_steps(root)) >= 1, 240, "the first step", run)
    run.proc.send_signal(sig)
    code, out = run.finish()
    assert code == 0, out
    assert "finishes its current step and checkpoints" in out
    assert "finishing this step" in out  # the trainer got it
    last = max(_steps(root))
    assert last < 200
    assert (root / "checkpoints" / f"step_{last}").is_dir()  # the last finished step is saved
    assert "stopping the inference server" in out
    assert run.orphans() == []


def test_two_sigints_stop_everything_now(tmp_path: Path, tiny_model_path: Path) -> None:
    config = write_config(tmp_path, tiny_model_path, steps=200)
    root = tmp_path / "outputs" / "rl"
    run = _start(tmp_path, config)
    wait_for(lambda: len(_steps(root)) >= 1, 240, "the first step", run)
    run.proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    run.proc.send_signal(signal.SIGINT)
    code, out = run.finish(timeout=60)
    assert code == 130, out
    assert "killing every process now" in out
    assert _state(root)["exit_code"] == 130
    assert run.orphans() == []


def test_killed_server_is_restarted_and_the_run_completes(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    config = write_config(tmp_path, tiny_model_path, steps=6)
    root = tmp_path / "outputs" / "rl"
    run = _start(tmp_path, config)
    wait_for(lambda: len(_steps(root)) >= 1, 240, "the first step", run)
    first_server = _state(root)["server_pid"]
    psutil.Process(first_server).kill()
    code, out = run.finish()
    assert code == 0, out
    assert "the inference server died" in out and "the trainer is paused" in out
    assert "server is back; the trainer continues" in out
    # the trainer re-loads what the new server lacks: no rollout met a missing adapter
    assert "does not exist" not in out
    metrics = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert sum(m.get("errors", 0) for m in metrics) == 0  # the paused trainer lost no rollout
    assert _state(root)["server_restarts"] == 1 and _state(root)["server_pid"] != first_server
    assert max(_steps(root)) == 6  # every step done, through the restarted server
    assert run.orphans() == []


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_run_has_three_panes_and_closes_itself(tmp_path: Path, tiny_model_path: Path) -> None:
    config = write_config(tmp_path, tiny_model_path, steps=2)
    root = tmp_path / "outputs" / "rl"
    env = vfrl_env(tmp_path)  # TMUX_TMPDIR=tmp: a private tmux server for this test
    out = subprocess.run(
        [sys.executable, "-m", "vfkit.cli.rl", str(config), "--tmux", "-s", "rltest"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "tmux attach -t rltest" in out.stdout

    def tmux(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", *args], capture_output=True, text=True, env=env)

    server_pid = int(tmux("display-message", "-p", "-t", "rltest", "#{pid}").stdout)
    panes = tmux("list-panes", "-t", "rltest", "-F", "#{pane_title}").stdout.split()
    assert sorted(panes) == ["metrics", "server", "trainer"]
    watcher = Tracked(["sleep", "0"], env=env, cwd=tmp_path, watch=(server_pid,))  # tmux's tree
    wait_for(lambda: _state(root).get("phase") == "done", 240, "the run to finish")
    assert _state(root)["exit_code"] == 0
    wait_for(lambda: tmux("has-session", "-t", "rltest").returncode != 0, 30, "session end")
    assert max(_steps(root)) == 2
    assert "run finished" in (root / "logs" / "vf-rl.log").read_text()
    assert len(watcher.seen) >= 4  # panes, supervisor, server, trainer were all seen ...
    assert watcher.orphans() == []  # ... and none is left
    tmux("kill-server")


def test_base_url_uses_the_running_server_and_starts_none(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    from vfkit.serve.launcher import start_server

    config = write_config(tmp_path, tiny_model_path, steps=2)
    root = tmp_path / "outputs" / "rl"
    with start_server(
        str(tiny_model_path),
        allowed_adapter_dirs=[str(root.resolve())],
        log_path=tmp_path / "external.log",
    ) as server:
        run = _start(tmp_path, config, f"inference.base_url={server.base_url}")
        code, out = run.finish()
        assert server.alive()  # vf-rl leaves a server it did not start alone
    assert code == 0, out
    assert "starting the inference server" not in out
    assert f"inference.base_url={server.base_url}" in out
    assert "server_pid" not in _state(root)
    assert max(_steps(root)) == 2
    assert run.orphans() == []


@pytest.mark.skipif(
    shutil.which("tmux") is None or shutil.which("script") is None, reason="needs tmux and script"
)
def test_run_from_a_terminal_attaches_to_its_tmux_session(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    config = write_config(tmp_path, tiny_model_path, steps=2)
    root = tmp_path / "outputs" / "rl"
    env = vfrl_env(tmp_path)
    command = shlex.join([sys.executable, "-m", "vfkit.cli.rl", str(config), "-s", "tty"])
    run = Tracked(["script", "-qfc", command, "/dev/null"], env=env, cwd=tmp_path)  # a terminal

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", *args], capture_output=True, text=True, env=env).stdout

    wait_for(lambda: "(attached)" in tmux("ls"), 60, "an attached tmux session", run)
    run.watch_also(int(tmux("display-message", "-p", "-t", "tty", "#{pid}")))
    wait_for(lambda: _state(root).get("phase") == "done", 240, "the run to finish", run)
    panes = dict(
        line.split()
        for line in tmux("list-panes", "-t", "tty", "-F", "#{pane_title} #{pane_id}").splitlines()
    )
    wait_for(
        lambda: "press Enter" in tmux("capture-pane", "-p", "-t", panes["trainer"]),
        30,
        "the prompt to close the session",
        run,
    )
    assert run.proc.poll() is None  # still attached: the user reads the last lines
    tmux("send-keys", "-t", panes["trainer"], "Enter")
    code, _ = run.finish(timeout=60)
    assert code == 0
    assert _state(root)["exit_code"] == 0 and max(_steps(root)) == 2
    assert "tty" not in tmux("ls")
    assert run.orphans() == []


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_session_name_in_use_is_an_error_that_says_what_to_do(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    config = write_config(tmp_path, tiny_model_path)
    env = vfrl_env(tmp_path)
    subprocess.run(["tmux", "new-session", "-d", "-s", "busy", "sleep 600"], env=env, check=True)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "vfkit.cli.rl", str(config), "--tmux", "-s", "busy"],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
    finally:
        subprocess.run(["tmux", "kill-server"], env=env)
    assert out.returncode == 1
    assert "a tmux session named 'busy' exists already" in out.stderr
    assert "tmux attach -t busy" in out.stderr and "-s NAME" in out.stderr
