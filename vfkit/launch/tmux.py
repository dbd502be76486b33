"""The tmux session of a run: server log | trainer (the supervisor itself) | live metrics.

The trainer pane runs the same foreground supervisor as `--no-tmux` (one code path for health
checks, restarts and stopping); the other two panes are read-only views that end with the run,
so the session disappears by itself when the run is over.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence

from vfkit.errors import VfkitError
from vfkit.train.rundir import RunDir

_SKIP_ENV = re.compile(r"^(TMUX.*|TERM|TERM_.*|COLUMNS|LINES|SHLVL|_|PWD|OLDPWD)$")


def tmux_path() -> str | None:
    return shutil.which("tmux")


def session_name(name: str) -> str:
    """tmux forbids '.' and ':' in session names."""
    return re.sub(r"[.:\s]", "_", name) or "vfkit"


def _tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    tmux = tmux_path()
    if tmux is None:
        raise VfkitError(
            "tmux is not installed: install it (apt-get install tmux) or use --no-tmux"
        )
    return subprocess.run([tmux, *args], capture_output=True, text=True, check=check)


def session_exists(name: str) -> bool:
    return (
        tmux_path() is not None
        and _tmux("has-session", "-t", f"={name}", check=False).returncode == 0
    )


def session_attached(name: str) -> bool:
    """Whether a client is attached to the session (someone may be reading its panes)."""
    out = _tmux("list-sessions", "-F", "#{session_name}\t#{session_attached}", check=False)
    for line in out.stdout.splitlines():
        session, _, attached = line.partition("\t")
        if session == name:
            return attached.strip() not in ("", "0")
    return False


def kill_session(name: str) -> bool:
    return (
        session_exists(name)
        and _tmux("kill-session", "-t", f"={name}", check=False).returncode == 0
    )


def _env_flags() -> list[str]:
    """-e VAR=value for our environment: the tmux server may have been started elsewhere."""
    flags = []
    for key, value in os.environ.items():
        if not _SKIP_ENV.match(key):
            flags += ["-e", f"{key}={value}"]
    return flags


def _vfrl(*args: str) -> str:
    return shlex.join([sys.executable, "-m", "vfkit.cli.rl", *args])


def start_session(name: str, run: RunDir, supervisor_args: Sequence[str]) -> None:
    """Create the detached session: trainer pane top right, server log top left, metrics below."""
    if session_exists(name):
        raise VfkitError(
            f"a tmux session named {name!r} exists already: attach with `tmux attach -t {name}`, "
            f"or remove it with `vf-rl --clean {run.root}` (or pick another with -s NAME)"
        )
    cwd = os.getcwd()
    env = _env_flags()
    run.reset_state(phase="launching", tmux_session=name)  # views must not see the last run
    trainer_cmd = _vfrl(*supervisor_args, "--no-tmux", "--tmux-pane", name)
    pane = _tmux(
        "new-session",
        "-d",
        "-s",
        name,
        "-x",
        "220",
        "-y",
        "55",
        "-c",
        cwd,
        *env,
        "-P",
        "-F",
        "#{pane_id}",
        trainer_cmd,
    ).stdout.strip()
    def split(*how: str, command: str) -> str:
        """A new pane beside `pane` (placed by `how`) running `command`; its pane id."""
        return _tmux("split-window", *how, "-t", pane, "-c", cwd, *env, "-P", "-F", "#{pane_id}",
                     command).stdout.strip()

    metrics = split("-v", "-l", "35%", command=_vfrl("watch", str(run.root), "--pane"))
    server = split("-h", "-b", command=_vfrl("watch", str(run.root), "--log", "server", "--pane"))
    _tmux("set-option", "-t", name, "pane-border-status", "top", check=False)
    _tmux("set-option", "-t", name, "mouse", "on", check=False)
    for target, title in ((pane, "trainer"), (metrics, "metrics"), (server, "server")):
        _tmux("select-pane", "-t", target, "-T", title, check=False)
    _tmux("select-pane", "-t", pane, check=False)


def attach(name: str) -> str | None:
    """Show the session on this terminal; None on success, else why it could not be shown.

    Outside tmux this attaches (and returns when the user detaches or the run ends); inside
    tmux it switches this client instead (tmux refuses nested sessions), which fails with
    "no current client" when no client is attached to the tmux we run in (e.g. `make run` in a
    detached session): the run goes on either way.
    """
    if os.environ.get("TMUX"):
        out = _tmux("switch-client", "-t", f"={name}", check=False)
        return None if out.returncode == 0 else out.stderr.strip() or "switch-client failed"
    code = _tmux_interactive("attach-session", "-t", f"={name}")
    return None if code == 0 else f"tmux attach-session exited with {code}"


def _tmux_interactive(*args: str) -> int:
    tmux = tmux_path() or "tmux"
    return subprocess.call([tmux, *args])


def wait_for_enter_if_attached(name: str, timeout: float = 600.0) -> None:
    """Keep the finished trainer pane readable while someone looks at it."""
    if not session_attached(name):
        return
    import select

    print("\n[vf-rl] run over: press Enter to close this tmux session", flush=True)
    if sys.stdin.isatty():
        select.select([sys.stdin], [], [], timeout)
