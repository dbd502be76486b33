"""Run the inference server and the trainer side by side, and stop them cleanly.

Stop semantics (the operator's contract):
- Ctrl-C / SIGTERM / SIGHUP once: the trainer gets SIGINT (it finishes its step, checkpoints and
  exits 0), then the server is stopped; vf-rl exits 0.
- twice: every child process group is killed at once; vf-rl exits 130.
Server death mid-run: the trainer is paused (SIGSTOP: it sends nothing while the server is
down), the server restarts on the same port (bounded attempts), and the trainer continues
(SIGCONT), re-loading the adapters the new server lacks on first use. Should the trainer
still fail right after the incident, it is resumed from its last checkpoint. When the attempts
run out the trainer is asked to stop, which checkpoints. No child outlives vf-rl.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol
from urllib.parse import urlparse

from vfkit.errors import VfkitError
from vfkit.launch.plan import redact
from vfkit.launch.process import (
    Child,
    LogTail,
    Printer,
    kill_remaining_children,
    routine_access_line,
)
from vfkit.serve.launcher import health_url, is_healthy, tail
from vfkit.train.rundir import RunDir

EXIT_KILLED = 130
INCIDENT_WINDOW_S = 120.0  # a trainer failing this soon after a server restart is resumed


class Health(Enum):
    """How waiting for a server ended."""

    OK = "ok"
    DIED = "died"
    TIMEOUT = "timeout"
    STOPPED = "stopped"


class Server(Protocol):
    """What the supervisor needs from a started inference server."""

    base_url: str

    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    def stop(self, timeout: float = 10.0) -> int | None: ...

    def kill(self) -> None: ...

    def remember_descendants(self) -> None: ...


ServerFactory = Callable[[int | None], Server]
"""start(port) -> a started server (port None = any free port; restarts reuse the first one)."""


@dataclass
class RunSpec:
    """Everything the supervisor runs: the trainer command and how to get a server."""

    run: RunDir
    trainer_argv: Sequence[str]
    start_server: ServerFactory | None = None  # None: use base_url, start no server
    base_url: str | None = None
    api_key: str | None = None
    resume_argv: Sequence[str] | None = None  # the trainer resuming from its last checkpoint
    trainer_env: dict[str, str] = field(default_factory=dict)
    health_timeout: float = 300.0
    max_restarts: int = 3
    stop_timeout: float = 900.0  # how long the trainer may take to finish its step
    echo_server: bool = True  # False in tmux: the server pane shows server.log
    tmux_session: str | None = None
    report: bool = True


class Supervisor:
    """Foreground run: boot the server, start the trainer, watch both, handle signals."""

    def __init__(self, spec: RunSpec, printer: Printer | None = None) -> None:
        self.spec = spec
        self.run_dir = spec.run
        self.out = printer or Printer(log_path=spec.run.supervisor_log)
        self.stop_requests = 0
        self.server: Server | None = None
        self.trainer: Child | None = None
        self.base_url: str | None = spec.base_url
        self.server_port: int | None = None
        self.restarts = self.trainer_restarts = 0
        self.incident_at: float | None = None
        self.failure: str | None = None
        self.server_tail: LogTail | None = None

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop_requests += 1  # acted on by the loop: no locks taken inside a handler

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> int:
        """Run to the end; returns vf-rl's exit code."""
        self.install_signal_handlers()
        self.run_dir.logs.mkdir(parents=True, exist_ok=True)
        self.run_dir.reset_state(
            supervisor_pid=os.getpid(), phase="starting", started_at=time.time(),
            tmux_session=self.spec.tmux_session, exit_code=None,
        )  # fmt: skip
        code = 1
        try:
            code = self._run()
        finally:
            self._shutdown(killed=code == EXIT_KILLED)
            self.run_dir.update_state(phase="done", exit_code=code, ended_at=time.time())
        if code != EXIT_KILLED and self.spec.report:
            self._write_report()
        self.out.say(self._final_message(code))
        self.out.close()
        return code

    def _run(self) -> int:
        if self.spec.start_server is not None:
            self.base_url = self._boot_server()
            if self.base_url is None:
                return EXIT_KILLED if self.stop_requests > 1 else (0 if self.stop_requests else 1)
        elif self.base_url and not is_healthy(self.base_url, api_key=self.spec.api_key):
            self.out.say(f"warning: the server at {self.base_url} does not answer /health yet")
        self.run_dir.update_state(phase="running", base_url=self.base_url)
        self._start_trainer(self.spec.trainer_argv)
        return self._watch()

    def _start_trainer(self, argv: Sequence[str]) -> None:
        argv = [*argv, f"inference.base_url={self.base_url}"]
        self.out.say("starting the trainer: " + " ".join(redact(argv)))
        self.trainer = Child(
            "trainer", argv, log_path=self.run_dir.trainer_log, echo=self.out,
            env=self.spec.trainer_env,
        ).start()  # fmt: skip
        self.run_dir.update_state(trainer_pid=self.trainer.pid)

    # -- the server ------------------------------------------------------------------------
    def _start_server(self) -> Server | None:
        assert self.spec.start_server is not None  # only called when we own the server
        try:
            server = self.spec.start_server(self.server_port)
        except VfkitError as exc:
            self.failure = f"could not start the inference server: {exc}"
            return None
        self.server, self.server_port = server, urlparse(server.base_url).port
        self.run_dir.update_state(server_pid=server.pid, base_url=server.base_url)
        return server

    def _boot_server(self) -> str | None:
        """Start the server and wait for /health; None if it failed or we were stopped."""
        self.out.say("starting the inference server")
        if self.spec.echo_server:
            self.server_tail = LogTail(
                self.run_dir.server_log, "server", self.out, skip=routine_access_line
            )
        server = self._start_server()
        if server is None:
            return None
        health = self._wait_healthy(server, self.spec.health_timeout)
        if health is Health.OK:
            self.out.say(f"server ready at {server.base_url}")
            return server.base_url
        self._server_failure(health, server.base_url)
        return None

    def _server_failure(self, health: Health, base_url: str) -> None:
        if health is Health.TIMEOUT:
            self.failure = (
                f"the server did not answer {health_url(base_url)} within "
                f"{self.spec.health_timeout:.0f} s; see {self.run_dir.server_log} "
                "(raise --health-timeout for big models)"
            )
        elif health is Health.DIED:
            self.failure = (
                f"the server exited while starting; last lines of {self.run_dir.server_log}:\n"
                + tail(self.run_dir.server_log)
            )

    def _wait_healthy(self, server: Server, timeout: float) -> Health:
        """Poll /health with a visible countdown; give up on death, timeout or a stop request."""
        requests_at_start = self.stop_requests
        deadline = time.monotonic() + timeout
        last_shown = None
        while True:
            if self.stop_requests > requests_at_start or self.stop_requests > 1:
                return Health.STOPPED
            if not server.alive():
                return Health.DIED
            if is_healthy(server.base_url, timeout=1.0, api_key=self.spec.api_key):
                return Health.OK
            left = deadline - time.monotonic()
            if left <= 0:
                return Health.TIMEOUT
            shown = int(left) // 10
            if shown != last_shown:  # one line per 10 s: readable in logs and panes alike
                self.out.say(f"waiting for {health_url(server.base_url)}: {int(left)} s left")
                last_shown = shown
            time.sleep(0.3)

    def _recover_server(self) -> bool:
        """Pause the trainer, restart the server, resume; False: gave up.

        The trainer re-loads the adapters the new server lacks itself, on the first request
        that asks for one (its AdapterSync owns "the server lost our adapters").
        """
        assert self.server is not None and self.trainer is not None  # a run with our server
        self.trainer.pause()
        self.incident_at = time.monotonic()
        code = getattr(self.server, "returncode", None)
        self.out.say(f"the inference server died (exit code {code}); the trainer is paused")
        while True:
            self.server.kill()
            if self.restarts >= self.spec.max_restarts:
                self.failure = (
                    f"the inference server died {self.restarts + 1} times; stopped the run "
                    f"(the trainer checkpoints). Last lines of {self.run_dir.server_log}:\n"
                    + tail(self.run_dir.server_log)
                )
                self.out.say("no server restart attempts left: stopping the run")
                self.trainer.resume()
                return False
            self.restarts += 1
            self.run_dir.update_state(server_restarts=self.restarts)
            self.out.say(
                f"restarting the server on port {self.server_port} "
                f"(attempt {self.restarts}/{self.spec.max_restarts})"
            )
            if self._start_server() is None:
                self.trainer.resume()
                return False
            health = self._wait_healthy(self.server, self.spec.health_timeout)
            if health is Health.OK:
                break
            if health is Health.STOPPED:
                self.trainer.resume()
                return True  # the watch loop handles the stop request
            self.out.say(f"restart attempt {self.restarts} failed ({health.value})")
        self.trainer.resume()
        self.incident_at = time.monotonic()
        self.out.say("server is back; the trainer continues")
        return True

    # -- watching --------------------------------------------------------------------------
    def _watch(self) -> int:
        """Poll the children until the trainer exits or we are told to stop."""
        forwarded_at: float | None = None
        last_snapshot = 0.0
        while True:
            assert self.trainer is not None  # started by _run
            if self.stop_requests > 1:
                self.out.say("second stop request: killing every process now")
                return EXIT_KILLED
            if self.stop_requests == 1 and forwarded_at is None:
                self.out.say(
                    "stopping: the trainer finishes its current step and checkpoints "
                    "(press Ctrl-C again to stop now)"
                )
                self.run_dir.update_state(phase="stopping")
                self.trainer.signal(signal.SIGINT)
                self.trainer.resume()
                forwarded_at = time.monotonic()
            code = self.trainer.returncode
            if code is not None:
                self.trainer.wait(5)
                result = self._after_trainer_exit(code, stopping=forwarded_at is not None)
                if result is not None:
                    return result
                continue
            if (
                forwarded_at is not None
                and time.monotonic() - forwarded_at > self.spec.stop_timeout
            ):
                self.failure = f"the trainer did not stop within {self.spec.stop_timeout:.0f} s"
                return 1
            server_died = self.server is not None and not self.server.alive()
            if server_died and forwarded_at is None and not self._recover_server():
                self.stop_requests = max(self.stop_requests, 1)  # stop with a checkpoint
            elif time.monotonic() - last_snapshot > 2.0:
                self._snapshot()
                last_snapshot = time.monotonic()
            time.sleep(0.2)

    def _snapshot(self) -> None:
        """Remember the trainer's and the server's descendants (to kill them all at the end)."""
        assert self.trainer is not None
        self.trainer.remember_descendants()
        if self.server is not None:
            self.server.remember_descendants()

    def _after_trainer_exit(self, code: int, *, stopping: bool) -> int | None:
        """vf-rl's exit code, or None when the trainer was resumed from its checkpoint."""
        if code == 0 or (stopping and code in (-signal.SIGINT, 130)):
            return 1 if self.failure else 0
        recent = self.incident_at is not None and (
            time.monotonic() - self.incident_at < INCIDENT_WINDOW_S
        )
        has_checkpoint = bool(self.run_dir.list_checkpoints())  # complete ones
        can_resume = self.spec.resume_argv is not None and has_checkpoint
        if (
            recent
            and not stopping
            and can_resume
            and self.trainer_restarts < self.spec.max_restarts
        ):
            self.trainer_restarts += 1
            self.out.say(
                f"the trainer exited with code {code} after the server restart; resuming it from "
                f"its last checkpoint ({self.trainer_restarts}/{self.spec.max_restarts})"
            )
            assert self.trainer is not None and self.spec.resume_argv is not None
            self.trainer.kill()  # its leftovers, if any
            self._start_trainer(self.spec.resume_argv)
            return None
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in
               signal.valid_signals() else f"exited with code {code}")
        resume = (" Continue from its last checkpoint with `vf-rl CONFIG --resume`."
                  if has_checkpoint else "")
        self.failure = self.failure or (
            f"the trainer {how}.{resume} Last lines of {self.run_dir.trainer_log}:\n"
            + tail(self.run_dir.trainer_log)
        )
        return 1

    # -- the end ---------------------------------------------------------------------------
    def _shutdown(self, *, killed: bool) -> None:
        """Stop every child; killed=True skips the grace periods."""
        if self.trainer is not None:
            if killed:
                self.trainer.kill()
            elif self.trainer.alive():
                self.trainer.stop(timeout=10)
            self.trainer.kill()  # grandchildren left by a trainer that exited on its own
        if self.server is not None:
            self.out.say("stopping the inference server")
            if killed:
                self.server.kill()
            else:
                self.server.stop(timeout=10)
        with contextlib.suppress(Exception):
            kill_remaining_children()
        if self.server_tail is not None:
            self.server_tail.close()  # after the server stopped: its last lines are shown

    def _write_report(self) -> None:
        if not self.run_dir.metrics.exists():
            return
        try:
            from vfkit.launch.report import write_report

            self.out.say(f"report: {write_report(self.run_dir)}")
        except Exception as exc:  # a broken report must not hide how the run ended
            self.out.say(f"could not write the report: {type(exc).__name__}: {exc}")

    def _final_message(self, code: int) -> str:
        if code == 0:
            return f"run finished; outputs in {self.run_dir.root}"
        if code == EXIT_KILLED:
            return f"run killed; the last checkpoint is in {self.run_dir.checkpoints}"
        return f"run failed: {self.failure or 'see the logs in ' + str(self.run_dir.logs)}"
