"""Closing a sandbox deletes its directory whatever the code left there, and never raises.

Python 3.11's shutil.rmtree recursed once per level: a tree ~1000 deep made close() raise
RecursionError, lost the rollout and left the data on disk.
"""

from __future__ import annotations

import array
import fcntl
import logging
import os
from pathlib import Path

import pytest

from vfkit.sandbox import Sandbox, SandboxLimits

LIMITS = SandboxLimits(timeout_s=8, cpu_seconds=8)
FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _deep_tree(top: Path, depth: int) -> None:
    """`depth` nested directories under `top`, deeper than PATH_MAX allows to name at once."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("blob", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    os.close(fd)


def test_close_deletes_a_deep_locked_tree_and_nothing_it_links_to(tmp_path: Path) -> None:
    outside = tmp_path / "keep"
    outside.mkdir()
    (outside / "file.txt").write_text("host data")
    sb = Sandbox(LIMITS)
    _deep_tree(sb.path, 3000)  # 6000 characters of path: past PATH_MAX, and past recursion
    (sb.path / "locked").mkdir()
    (sb.path / "locked" / "inner.txt").write_text("x")
    (sb.path / "locked").chmod(0)  # the code may take every permission off its own directory
    (sb.path / "to_dir").symlink_to(outside)  # links are deleted, never followed
    (sb.path / "to_file").symlink_to(outside / "file.txt")
    os.mkfifo(sb.path / "fifo")
    sb.close()
    assert not sb.path.exists()
    assert (outside / "file.txt").read_text() == "host data"


def _set_immutable(path: Path, on: bool) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | FS_IMMUTABLE_FL if on else flags[0] & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
    finally:
        os.close(fd)


def test_a_directory_that_cannot_be_deleted_is_logged_not_raised(caplog) -> None:
    sb = Sandbox(LIMITS)
    stuck = sb.path / "stuck.txt"
    stuck.write_text("x")
    try:
        _set_immutable(stuck, True)  # not even root may delete it now
    except OSError as exc:
        sb.close()
        pytest.skip(f"this file system or user cannot set the immutable flag: {exc}")
    try:
        with caplog.at_level(logging.WARNING, logger="vfkit.sandbox.sandbox"):
            sb.close()  # must not raise
        assert f"could not delete {sb.path}" in caplog.text and "rm -rf" in caplog.text
    finally:
        _set_immutable(stuck, False)
        stuck.unlink()
        sb.path.rmdir()
