"""The inference server's lifecycle, for every caller and backend: start, health, log, stop.

    with start_server("HuggingFaceTB/SmolLM2-135M-Instruct", log_path="server.log") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY")

vf-train, vf-eval and vf-rl's supervisor all start servers here and ask `is_healthy`. The child
runs in its own process group: `stop()` signals the whole group (SIGTERM, then SIGKILL) and
kills remembered descendants that left it, so engine workers do not outlive it. Servers still
running when this interpreter exits are stopped at exit; the embedded server also exits by
itself if its parent dies.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from vfkit.errors import ServerError

_LIVE: weakref.WeakSet[ServerProcess] = weakref.WeakSet()
_LOCK = threading.Lock()


class ServerProcess:
    """A started server: its URL, its process, health checks and a clean stop."""

    def __init__(
        self, popen: subprocess.Popen, base_url: str, api_key: str | None, log_path: Path
    ) -> None:
        self.popen = popen
        self.base_url = base_url
        self.api_key = api_key
        self.log_path = log_path
        self._stopped = False
        self.descendants = DescendantTracker()
        self.descendants.add(popen.pid)
        with _LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def remember_descendants(self) -> None:
        """Record engine workers while they live (a supervisor calls this every few seconds)."""
        self.descendants.refresh()

    def wait_healthy(self, timeout: float = 300.0) -> None:
        """Poll GET /health until it answers 200; raise ServerError (with the log's tail) if not."""
        deadline = time.monotonic() + timeout
        while not is_healthy(self.base_url, api_key=self.api_key):
            if not self.alive():
                raise ServerError(
                    f"The server exited with code {self.popen.returncode} before it was ready. "
                    f"Last lines of {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ServerError(
                    f"The server at {self.base_url} was not healthy after {timeout:.0f} s. "
                    f"Last lines of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.25)

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_path, lines)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL whatever is left after `timeout` seconds."""
        with _LOCK:
            _LIVE.discard(self)
            if self._stopped:
                return self.popen.poll()
            self._stopped = True
        _signal_group(self.popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout)
        _signal_group(self.popen.pid, signal.SIGKILL)  # stragglers in the group, if any
        self.descendants.refresh()
        self.descendants.kill_all()  # workers that left the group
        try:
            return self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """Stop at once: SIGTERM, then SIGKILL half a second later; no worker spared."""
        self.stop(timeout=0.5)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(
    model: str,
    *,
    backend: str = "builtin",
    host: str = "127.0.0.1",
    port: int | None = None,
    api_key: str | None = None,
    allowed_adapter_dirs: Sequence[str | Path] = (),
    max_lora_rank: int = 64,
    max_loras: int = 4,
    dtype: str = "auto",
    log_path: str | Path | None = None,
    extra_args: Sequence[str] = (),
    health_timeout: float = 300.0,
    wait: bool = True,
    data_parallel_size: int = 1,
    tensor_parallel_size: int = 1,
    executable: str | None = None,
) -> ServerProcess:
    """Start `model` behind an OpenAI-compatible server; with `wait`, return once it is healthy.

    backend "builtin" runs `python -m vfkit.cli.serve` (vf-serve); "vllm" runs vLLM's OpenAI
    server (the python of `executable`/$VFKIT_VLLM_PYTHON, else this one). `port=None` picks a
    free port.
    """
    port = port or free_port(host)
    log = Path(log_path) if log_path else _default_log(port)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if backend == "builtin":
        cmd = [executable or sys.executable, "-m", "vfkit.cli.serve", model, "--host", host]
        cmd += ["--port", str(port), "--max-lora-rank", str(max_lora_rank)]
        cmd += ["--max-loras", str(max_loras), "--dtype", dtype]
        for folder in allowed_adapter_dirs:
            cmd += ["--allowed-adapter-dir", str(folder)]
        cmd += list(extra_args)
        env["VFKIT_EXIT_WITH_PARENT"] = str(os.getpid())
        if api_key:
            env["VFKIT_API_KEY"] = api_key  # not on the command line, where `ps` shows it
    elif backend == "vllm":
        from vfkit.hub import resolve_model
        from vfkit.serve.vllm import vllm_command, vllm_env, vllm_python

        python = vllm_python(executable)
        path = resolve_model(model)
        cmd = vllm_command(
            python,
            str(path),
            served_name=model,
            host=host,
            port=port,
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
            dtype=dtype,
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            extra_args=extra_args,
            images=_serves_images(path),
        )
        env.update(vllm_env(api_key))
    else:
        raise ServerError(f"Unknown server backend {backend!r}: use 'builtin' or 'vllm'.")
    with log.open("ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        popen = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
    client_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    server = ServerProcess(popen, f"http://{client_host}:{port}/v1", api_key, log)
    if wait:
        try:
            server.wait_healthy(health_timeout)
        except BaseException:
            server.stop(timeout=5)
            raise
    return server


def _serves_images(path) -> bool:
    """Whether the model folder holds an image-text-to-text model (its config says so)."""
    from transformers import AutoConfig

    from vfkit.serve.model import is_vision_model

    return is_vision_model(AutoConfig.from_pretrained(path))


def health_url(base_url: str) -> str:
    """GET /health sits at the server root, beside /v1."""
    return base_url.rstrip("/").removesuffix("/v1") + "/health"


def is_healthy(base_url: str, timeout: float = 2.0, api_key: str | None = None) -> bool:
    """GET /health answers 200 (with the API key when the server demands one)."""
    request = urllib.request.Request(health_url(base_url))
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def tail(path: os.PathLike[str] | str, lines: int = 15) -> str:
    """The last lines of a log, indented, for error messages."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16_000))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "  (no log)"
    return "\n".join("  " + ln for ln in text.splitlines()[-lines:])


class DescendantTracker:
    """Remembers the descendants of some processes while they live, to kill them later."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def add(self, pid: int) -> None:
        with contextlib.suppress(psutil.Error):
            self._procs.setdefault(pid, psutil.Process(pid))

    def refresh(self) -> None:
        """Record the current descendants of every tracked process that still runs."""
        for proc in list(self._procs.values()):
            with contextlib.suppress(psutil.Error):
                for child in proc.children(recursive=True):
                    self._procs.setdefault(child.pid, child)

    def kill_all(self) -> None:
        """SIGKILL every tracked process still running (psutil checks pid reuse)."""
        for proc in self._procs.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    proc.kill()


def bind_error(host: str, port: int) -> str | None:
    """Why host:port cannot be bound now, as a server binds it (SO_REUSEADDR), or None: the
    one test of "is this port free" (vf-serve before it loads a model, the dry run)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host if host not in ("0.0.0.0", "") else "127.0.0.1", 0))
        return sock.getsockname()[1]


def _default_log(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"vfkit-server-{port}.log"


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the child leads its own group (start_new_session)


@atexit.register
def _stop_all() -> None:
    with _LOCK:
        live = list(_LIVE)
    for server in live:
        server.stop(timeout=5)


class KeptServer:
    """A server this process started, started again on the same port if it dies (at most
    `max_restarts` times): vf-train alone owns its builtin server, and a dead one cost the run
    its steps since the last checkpoint. Clients ride out the gap with their own retries, and
    the trainer re-loads the adapters the new server lacks (a 404 for one re-loads it).

    kept = KeptServer(lambda port: start_server(model, port=port, ...))
    kept.base_url ... kept.stop()
    """

    def __init__(self, start: Callable[[int | None], ServerProcess], max_restarts: int = 3,
                 poll_s: float = 1.0) -> None:
        self._start, self.max_restarts, self.restarts = start, max_restarts, 0
        self.failure: str | None = None  # set when it gave up: the run cannot go on
        self.server = start(None)
        self.base_url = self.server.base_url
        self._port = int(self.base_url.rsplit(":", 1)[1].split("/", 1)[0])
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._keep, args=(poll_s,), daemon=True,
                                       name="vfkit-server-keeper")  # fmt: skip
        self._watch.start()

    def _keep(self, poll_s: float) -> None:
        try:
            while not self._stopping.wait(poll_s):
                if not self.server.alive():
                    self._restart()
        except Exception as exc:
            self.failure = self.failure or f"restarting the inference server failed: {exc}"
            _say(self.failure)

    def _restart(self) -> None:
        code = self.server.returncode
        if self.restarts >= self.max_restarts:
            self.failure = (f"the inference server exited again (code {code}) after "
                            f"{self.restarts} restarts; see its log: {self.server.log_path}")
            raise ServerError(self.failure)
        self.restarts += 1
        _say(f"the inference server exited (code {code}); starting it again on port "
             f"{self._port} ({self.restarts}/{self.max_restarts}; its log: "
             f"{self.server.log_path})")
        server = self._start(self._port)
        self.server = server
        if self._stopping.is_set():  # stopped while it started: nobody else will stop it
            server.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._watch.join(timeout=5)  # a restart in progress stops its server itself
        self.server.stop()


def _say(line: str) -> None:
    print(f"vf-train: {line}", file=sys.stderr, flush=True)
