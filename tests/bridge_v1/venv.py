"""The verifiers venv the bridge tests run in, built with the standard library alone.

`make test` starts `python tests/bridge_v1/venv.py` beside `make install` (two pip installs,
one core each, instead of the tests waiting minutes for this one); the tests' `v1_python`
fixture builds whatever is still missing. The base (a venv with the newest verifiers from
PyPI) is built here; this checkout's vfkit and environments go in at test time, once the
checkout's own install has written their metadata.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".cache" / "bridge-v1-venv"
BASE_STAMP = VENV / ".verifiers"
T = TypeVar("T")


class VerifiersUnreachable(RuntimeError):
    """PyPI could not hand over verifiers (no network): the bridge tests skip."""


def run(cmd: list[str], what: str, timeout: float = 1200, env: dict | None = None) -> str:
    """Run `cmd` from the checkout's root; its stdout, or a RuntimeError saying `what` failed."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)
    if done.returncode:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                           f"{done.stderr[-4000:]}")
    return done.stdout


def base_python() -> str:
    """python3.12 (prime-rl's) when it runs here, else this interpreter (verifiers: >=3.11)."""
    for candidate in (shutil.which("python3.12"), sys.executable):
        if candidate and subprocess.run([candidate, "--version"],
                                        capture_output=True).returncode == 0:
            return candidate
    return sys.executable


def build_base() -> None:
    """A fresh venv holding verifiers and datasets, unless one is already complete.

    The caller holds the build lock (`.cache/bridge-v1-venv.lock`)."""
    if BASE_STAMP.exists():
        return
    shutil.rmtree(VENV, ignore_errors=True)
    run([base_python(), "-m", "venv", str(VENV)], "creating the venv")
    pip = str(VENV / "bin" / "pip")
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run([pip, "download", "-q", "--no-deps", "-d", tmp, "verifiers"],
                               capture_output=True, text=True, timeout=300)
    if probe.returncode:
        raise VerifiersUnreachable(f"PyPI unreachable, cannot get verifiers: "
                                   f"{probe.stderr[-300:]}")
    run([pip, "install", "-q", "verifiers", "datasets"], "installing verifiers")
    BASE_STAMP.touch()


def locked(build: Callable[[], T]) -> T:
    """Call `build()` holding the lock parallel test workers (and `make test`) share."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "bridge-v1-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build()


if __name__ == "__main__":
    try:
        locked(build_base)
    except (RuntimeError, subprocess.TimeoutExpired) as error:  # the tests try again, or skip
        print(f"bridge venv not prebuilt: {error}", file=sys.stderr)
