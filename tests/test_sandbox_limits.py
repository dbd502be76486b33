"""Sandbox limits are checked where they enter: each bad value is refused by its name."""

from __future__ import annotations

import math

import pytest

from vfkit.sandbox import Sandbox, SandboxLimits

BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, 0, "5", None, True]
COUNTS = ["cpu_seconds", "memory_mb", "max_processes", "file_size_mb", "open_files",
          "max_output_bytes"]
CASES = (
    [("timeout_s", v) for v in BAD_NUMBERS]
    + [(name, v) for name in COUNTS for v in [*BAD_NUMBERS, 1.5, 2**40]]
    + [(name, v) for name in ("isolate_network", "allow_subprocess", "require_isolation",
                              "allow_weak_isolation")
       for v in ("yes", 1, None)]
)


@pytest.mark.parametrize(("name", "value"), CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_bad_limit_is_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"SandboxLimits\.{name} must be .*got {value!r}"):
        SandboxLimits(**{name: value})


def test_good_limits_are_kept_and_whole_floats_become_ints() -> None:
    limits = SandboxLimits(timeout_s=2, memory_mb=512.0, max_output_bytes=1)
    assert limits.timeout_s == 2.0 and isinstance(limits.timeout_s, float)
    assert limits.memory_mb == 512 and isinstance(limits.memory_mb, int)
    assert limits.max_output_bytes == 1


@pytest.mark.parametrize("timeout", [math.nan, math.inf, 0, -3, "1"])
async def test_bad_timeout_for_one_run_is_refused_by_name(timeout: object) -> None:
    with Sandbox(SandboxLimits(timeout_s=5)) as sb:
        with pytest.raises(ValueError, match=r"Sandbox\.run timeout_s must be"):
            await sb.run("print(1)", timeout_s=timeout)  # type: ignore[arg-type]  # the point
        with pytest.raises(ValueError, match=r"Sandbox\.run: code must be a str"):
            await sb.run(b"print(1)")  # type: ignore[arg-type]  # the point


async def test_stdin_that_is_not_utf8_text_is_refused_before_the_run() -> None:
    with Sandbox(SandboxLimits(timeout_s=5)) as sb:
        with pytest.raises(ValueError, match=r"Sandbox\.run: stdin cannot be sent to the "
                                             r"program: '\\udc80' at position 3 is a lone"):
            await sb.run("print(input())", stdin="abc\udc80")
        again = await sb.run("print(input())", stdin="abc\n")  # the sandbox goes on
    assert again.stdout == "abc\n"


async def test_a_timeout_for_one_run_overrides_the_limit() -> None:
    with Sandbox(SandboxLimits(timeout_s=30, cpu_seconds=30)) as sb:
        result = await sb.run("while True:\n    pass\n", timeout_s=0.5)
    assert result.status == "timeout" and result.duration_s < 10


def test_bad_sandbox_arguments_are_refused_by_name(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"Sandbox base_dir '.*missing' is not an existing dir"):
        Sandbox(base_dir=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="Sandbox limits must be a SandboxLimits, got dict"):
        Sandbox({"timeout_s": 5})  # type: ignore[arg-type]  # the point
    assert list(tmp_path.iterdir()) == []


def test_weak_and_required_isolation_together_are_refused() -> None:
    with pytest.raises(ValueError, match="require_isolation and allow_weak_isolation contradict"):
        SandboxLimits(require_isolation=True, allow_weak_isolation=True)
