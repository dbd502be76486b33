"""The supervisor's mechanics with small stand-in children: signals, restarts, no orphans.

The stand-in server answers /health; the stand-in trainer counts steps, finishes its step and
writes a checkpoint marker on SIGINT, pauses while the server is down, and leaves a grandchild
(`sleep`) running so that the orphan checks have something to find. The real vf-rl + vf-train +
server are driven in tests/test_rl_cli.py.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

SERVER = textwrap.dedent(
    """
    import http.server, os, sys
    if "--die" in sys.argv:
        print("boot failed: no model", flush=True); sys.exit(3)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(str(os.getpid()).encode())
        def log_message(self, *a):
            print("GET", self.path, flush=True)
    print("stand-in server up", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)

TRAINER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time, urllib.request
    out, steps = sys.argv[1], int(sys.argv[2])
    url = sys.argv[-1].split("=", 1)[1].removesuffix("/v1") + "/health"
    strict, resume = "--strict" in sys.argv, "--resume" in sys.argv
    half = "--half-checkpoints" in sys.argv  # step dirs without state.json: killed mid-save
    subprocess.Popen(["sleep", "300"])  # a grandchild the supervisor must not leave behind
    stop = []
    def on_int(*_):
        stop.append(1)
        if len(stop) > 1:
            sys.exit(130)
    signal.signal(signal.SIGINT, on_int)
    step = int(open(out + "/steps").read()) if resume else 0
    first_server = None
    while step < steps and not stop:
        try:
            server = urllib.request.urlopen(url, timeout=1).read()
        except OSError:
            print("server down: pausing", flush=True); time.sleep(0.2); continue
        first_server = first_server or server
        if strict and not resume and server != first_server:
            print("my adapter is gone: the server restarted", flush=True); sys.exit(1)
        time.sleep(0.3)
        step += 1
        open(out + "/steps", "w").write(str(step))
        os.makedirs(f"{out}/checkpoints/step_{step}", exist_ok=True)
        if not half:
            open(f"{out}/checkpoints/step_{step}/state.json", "w").write("{}")
        print(f"step {step}", flush=True)
    open(out + "/checkpoint", "w").write(str(step))
    print("checkpointed at step", step, flush=True)
    """
)

DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from vfkit.launch.process import Child, become_subreaper
    from vfkit.train.rundir import RunDir
    from vfkit.launch.supervisor import RunSpec, Supervisor
    cfg = json.loads(sys.argv[1])
    run = RunDir(Path(cfg["run"]))
    boots = []
    def start_server(port):
        boots.append(port)
        die = len(boots) > 1 and cfg["restart_dies"]
        argv = [sys.executable, cfg["server"], str(cfg["port"])]
        argv += ["--die"] if die or cfg["boot_dies"] else []
        child = Child("server", argv, log_path=run.server_log)
        child.base_url = f"http://127.0.0.1:{cfg['port']}/v1"
        return child.start()
    become_subreaper()
    trainer = [sys.executable, cfg["trainer"], cfg["run"], str(cfg["steps"])]
    trainer += ["--strict"] if cfg["strict"] else []
    trainer += ["--half-checkpoints"] if cfg.get("half_checkpoints") else []
    spec = RunSpec(run=run, trainer_argv=trainer, start_server=start_server, health_timeout=20,
                   resume_argv=[*trainer, "--resume"],
                   max_restarts=cfg["max_restarts"], stop_timeout=30, report=False)
    sys.exit(Supervisor(spec).run())
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """A supervisor in a subprocess, with every descendant it ever had recorded."""

    def __init__(self, tmp: Path, **overrides: object) -> None:
        for name, text in (("server.py", SERVER), ("trainer.py", TRAINER), ("driver.py", DRIVER)):
            (tmp / name).write_text(text)
        self.dir = tmp / "run"
        cfg = {
            "run": str(self.dir),
            "server": str(tmp / "server.py"),
            "port": _free_port(),
            "trainer": str(tmp / "trainer.py"),
            "steps": 200,
            "max_restarts": 2,
            "restart_dies": False,
            "strict": False,
            "boot_dies": False,
            **overrides,
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp / "driver.py"), json.dumps(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.seen: set[psutil.Process] = set()
        self._watch = threading.Thread(target=self._record, daemon=True)
        self._watch.start()

    def _record(self) -> None:
        parent = psutil.Process(self.proc.pid)
        while self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                self.seen.update(parent.children(recursive=True))
            time.sleep(0.05)

    def steps(self) -> int:
        path = self.dir / "steps"
        return int(path.read_text() or 0) if path.exists() else 0

    def wait_steps(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.steps() < n:
            assert self.proc.poll() is None, self.proc.stdout.read()
            assert time.monotonic() < deadline, "the stand-in trainer made no progress"
            time.sleep(0.05)

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        self._watch.join()
        return self.proc.returncode, out

    def orphans(self) -> list[str]:
        time.sleep(0.2)
        left = []
        for p in self.seen:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {p.cmdline()}")
            except psutil.Error:
                pass
        return left


def test_run_to_the_end_stops_the_server(tmp_path: Path) -> None:
    run = Run(tmp_path, steps=3)
    code, out = run.finish()
    assert code == 0, out
    assert (run.dir / "checkpoint").read_text() == "3"
    assert "[server]" in out and "stand-in server up" in out  # server log echoed with a prefix
    assert "step 3" in (run.dir / "logs" / "trainer.log").read_text()
    assert "stand-in server up" in (run.dir / "logs" / "server.log").read_text()
    assert json.loads((run.dir / ".vfrl" / "state.json").read_text())["phase"] == "done"
    assert len(run.seen) >= 3  # server, trainer, sleep were all seen ...
    assert run.orphans() == []  # ... and none survived


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_one_stop_signal_finishes_the_step_and_checkpoints(tmp_path: Path, sig: int) -> None:
    run = Run(tmp_path)
    run.wait_steps(2)
    run.proc.send_signal(sig)
    code, out = run.finish()
    assert code == 0, out
    assert "finishes its current step" in out
    assert int((run.dir / "checkpoint").read_text()) >= 2  # the trainer checkpointed
    assert run.orphans() == []


def test_two_sigints_kill_everything_now(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.wait_steps(1)
    run.proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    run.proc.send_signal(signal.SIGINT)
    code, out = run.finish()
    assert code == 130, out
    assert "killing every process now" in out
    assert run.orphans() == []


@pytest.mark.slow
def test_dead_server_is_restarted_and_the_trainer_carries_on(tmp_path: Path) -> None:
    run = Run(tmp_path, steps=8)
    run.wait_steps(2)
    state = json.loads((run.dir / ".vfrl" / "state.json").read_text())
    psutil.Process(state["server_pid"]).kill()
    code, out = run.finish()
    assert code == 0, out
    assert "the trainer is paused" in out and "(attempt 1/2)" in out
    assert "server is back; the trainer continues" in out
    assert json.loads((run.dir / ".vfrl" / "state.json").read_text())["server_restarts"] == 1
    assert (run.dir / "checkpoint").read_text() == "8"
    assert run.orphans() == []


def test_a_trainer_without_a_complete_checkpoint_is_not_resumed(tmp_path: Path) -> None:
    """Step folders without state.json (a save cut short) are no checkpoint: resuming from
    them could only fail, so the run stops with the trainer's error instead."""
    run = Run(tmp_path, steps=8, strict=True, half_checkpoints=True)
    run.wait_steps(2)
    psutil.Process(json.loads((run.dir / ".vfrl" / "state.json").read_text())["server_pid"]).kill()
    code, out = run.finish()
    assert code != 0 and "my adapter is gone" in out
    assert "resuming it" not in out
    assert run.orphans() == []


@pytest.mark.slow
def test_trainer_failing_after_a_server_restart_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, steps=8, strict=True)
    run.wait_steps(2)
    psutil.Process(json.loads((run.dir / ".vfrl" / "state.json").read_text())["server_pid"]).kill()
    code, out = run.finish()
    assert code == 0, out
    assert "my adapter is gone" in out  # the first trainer failed after the restart ...
    assert "resuming it from its last checkpoint (1/2)" in out  # ... and was resumed
    assert "--resume inference.base_url=" in out
    assert (run.dir / "checkpoint").read_text() == "8"
    assert run.orphans() == []


def test_server_that_keeps_dying_stops_the_run_with_a_checkpoint(tmp_path: Path) -> None:
    run = Run(tmp_path, restart_dies=True, max_restarts=1)
    run.wait_steps(1)
    state = json.loads((run.dir / ".vfrl" / "state.json").read_text())
    psutil.Process(state["server_pid"]).kill()
    code, out = run.finish()
    assert code == 1, out
    assert "died 2 times" in out and "boot failed: no model" in out
    assert (run.dir / "checkpoint").exists()  # stopped through SIGINT: the trainer saved
    assert run.orphans() == []


def test_server_that_fails_to_boot_is_reported_with_its_log(tmp_path: Path) -> None:
    run = Run(tmp_path, boot_dies=True)
    code, out = run.finish()
    assert code == 1, out
    assert "exited while starting" in out and "boot failed: no model" in out
    assert not (run.dir / "logs" / "trainer.log").exists()  # no trainer without a server
    assert run.orphans() == []


def test_a_killed_trainer_is_named_with_its_signal_and_the_resume_command(tmp_path: Path) -> None:
    """It said "the trainer exited with code -9", with no word on how to go on."""
    run = Run(tmp_path)
    run.wait_steps(2)
    (trainer,) = [p for p in psutil.Process(run.proc.pid).children(recursive=True)
                  if "trainer.py" in " ".join(p.cmdline())]
    trainer.kill()
    code, out = run.finish()
    assert code == 1, out
    assert "the trainer was killed by SIGKILL" in out and "--resume" in out, out


def test_the_foreground_echo_leaves_successful_access_lines_in_the_server_log(tmp_path):
    """A 4-step foreground run echoed 231 access lines among 5 trainer lines."""
    import io

    from vfkit.launch.process import LogTail, Printer, routine_access_line

    log = tmp_path / "server.log"
    log.write_text("")
    out = io.StringIO()
    tail = LogTail(log, "server", Printer(stream=out), skip=routine_access_line)
    log.write_text(
        'INFO:     127.0.0.1:50432 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
        'INFO:     127.0.0.1:50433 - "POST /v1/load_lora_adapter HTTP/1.1" 400 Bad Request\n'
        "INFO:     Application startup complete.\n"
        'INFO:     127.0.0.1:50434 - "GET /health HTTP/1.1" 503 Service Unavailable\n'
    )
    tail.close()
    echoed = out.getvalue()
    assert "chat/completions" not in echoed  # in the file only
    assert "400 Bad Request" in echoed and "503" in echoed and "startup complete" in echoed
