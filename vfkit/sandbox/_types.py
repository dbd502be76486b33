"""What a sandbox run takes and gives: its limits (checked where they enter) and its result.

Split from sandbox.py so that the run machinery there stays short; `vfkit.sandbox` exports both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_MAX_COUNT = 2**31 - 1  # limits in whole units; far above any sensible value, fits every rlimit
_COUNTS = ("cpu_seconds", "memory_mb", "max_processes", "file_size_mb", "open_files",
           "max_output_bytes")
_SWITCHES = ("isolate_network", "allow_subprocess", "require_isolation", "allow_weak_isolation")


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for each run of code in a sandbox."""

    timeout_s: float = 10.0  # wall clock for the whole run
    cpu_seconds: int = 10  # RLIMIT_CPU, per process (SIGXCPU, then SIGKILL a second later)
    memory_mb: int = 1024  # RLIMIT_AS, per process
    max_processes: int = 16  # RLIMIT_NPROC: processes + threads of the sandbox (root: exact)
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file the code may write
    open_files: int = 64  # RLIMIT_NOFILE
    # kept per stream (stdout, stderr); the rest is counted, and 1 MiB past it the run is
    # stopped (status output_limit)
    max_output_bytes: int = 16_384
    isolate_network: bool = True  # new network namespace + AF_UNIX-only sockets (seccomp)
    allow_subprocess: bool = False  # let the code start other programs (execve)
    require_isolation: bool = False  # refuse to run where any kernel layer is missing
    # run even where the filesystem, processes or syscalls layer is missing (the code can then
    # reach the host's files and processes); off, such a run is refused (status setup_failed)
    allow_weak_isolation: bool = False

    def __post_init__(self) -> None:
        """Reject what the kernel cannot apply (NaN, inf, zero, negative, wrong type) by name."""
        object.__setattr__(self, "timeout_s", _check_seconds("SandboxLimits.timeout_s",
                                                            self.timeout_s))
        for name in _COUNTS:
            object.__setattr__(self, name, _check_count(name, getattr(self, name)))
        for name in _SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SandboxLimits.{name} must be true or false, "
                                 f"got {getattr(self, name)!r}")
        if self.require_isolation and self.allow_weak_isolation:
            raise ValueError("SandboxLimits.require_isolation and allow_weak_isolation contradict "
                             "each other (every layer vs. fewer than the essential ones): set "
                             "at most one")


def _check_seconds(name: str, value: object) -> float:
    """`value` as a finite number of seconds > 0, else a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _check_count(name: str, value: object) -> int:
    """A whole-number limit from 1 to _MAX_COUNT (an integral float such as 512.0 is accepted)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_COUNT:
        raise ValueError(f"SandboxLimits.{name} must be a whole number from 1 to {_MAX_COUNT}, "
                         f"got {value!r}")
    return value


@dataclass
class SandboxResult:
    """What one run produced and how it ended."""

    stdout: str
    stderr: str
    exit_code: int | None  # negative: killed by that signal
    status: str  # ok | error | timeout | cpu_limit | killed | output_limit | setup_failed
    duration_s: float
    truncated: bool = False  # some output was dropped
    # which kernel layer held, per threat (network, ipc, processes, filesystem, identity,
    # syscalls) -> how, or "none (why)" where this machine could not give it (README's table)
    isolation: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def network(self) -> str:
        """How the network was cut: netns | userns+netns | off | none (why) | unknown."""
        return self.isolation.get("network", "unknown")

    def format(self, max_chars: int | None = None) -> str:
        """Text for a tool reply: output, errors, and a note when the run did not end cleanly."""
        parts = [self.stdout.rstrip("\n")] if self.stdout.strip() else []
        if self.stderr.strip():
            parts.append(self.stderr.rstrip("\n"))
        note = {
            "timeout": "[killed: wall-clock timeout]",
            "cpu_limit": "[killed: CPU time limit]",
            "killed": f"[killed by signal {-(self.exit_code or 0)}]",
            "setup_failed": "[sandbox could not start]",
            "output_limit": "[killed: too much output]",
        }.get(self.status)
        if self.status == "error" and self.exit_code not in (None, 1):
            note = f"[exit code {self.exit_code}]"
        if note:
            parts.append(note)
        text = "\n".join(parts) or "(no output)"
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars] + f"\n... [truncated {len(text) - max_chars} chars]"
        return text
