"""The seccomp filter's system call tables match the kernel headers, and a missing table is named.

A wrong number would silently let a refused call through (or refuse an innocent one), so each
table is checked against the headers installed on this machine where they are.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vfkit.sandbox import _seccomp

HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),  # arm64 uses the generic table
}


@pytest.mark.parametrize("machine", sorted(HEADERS))
def test_syscall_numbers_match_the_kernel_headers(machine: str) -> None:
    header = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    defined = {name: int(nr) for name, nr in
               re.findall(r"#define __NR_(\w+)\s+(\d+)\b", header.read_text())}
    _, table = _seccomp._ARCHES[machine]
    assert {name: defined.get(name) for name in table} == table


@pytest.mark.parametrize("machine", sorted(HEADERS))
def test_filter_is_a_whole_number_of_instructions(machine: str) -> None:
    strict = _seccomp.build_filter(machine, allow_exec=False, unix_sockets_only=True)
    lax = _seccomp.build_filter(machine, allow_exec=True, unix_sockets_only=False)
    assert len(strict) % 8 == 0 and len(lax) % 8 == 0  # struct sock_filter is 8 bytes
    # execve + execveat: 2 instructions each; the socket check: 5
    assert len(strict) - len(lax) == 8 * (2 * 2 + 5)


def test_an_architecture_without_a_table_is_named() -> None:
    with pytest.raises(OSError, match="no seccomp syscall table for architecture 'riscv64'"):
        _seccomp.build_filter("riscv64", allow_exec=False, unix_sockets_only=True)
