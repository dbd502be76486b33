"""Delete a sandbox directory whatever the code left in it, without recursion.

The code decides the shape of the tree: `shutil.rmtree` in Python 3.11 recurses once per level
and raised RecursionError on a tree ~1000 deep, leaving it on disk; paths of a deep tree also
outgrow PATH_MAX. So this walks with one open directory at a time (names relative to it, never
following a symlink), a list of pending subdirectories per level instead of the call stack, and
goes up through "..". It runs after every process of the sandbox is dead, so nothing moves
underneath it. Directories the code made unreadable or unwritable are opened up first.
"""

from __future__ import annotations

import os

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> None:
    """Delete `path` and everything under it; an OSError says what could not be deleted."""
    os.chmod(path, 0o700)
    fd = os.open(path, _DIR_FLAGS)
    try:
        stack = [("", _remove_files(fd))]  # per level: (its name in the parent, subdirs left)
        while stack:
            name, pending = stack[-1]
            if pending:
                sub = pending.pop()
                os.chmod(sub, 0o700, dir_fd=fd)  # a directory, not a link: listed as such
                child = os.open(sub, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                stack.append((sub, _remove_files(fd)))
                continue
            stack.pop()
            if stack:  # this level is empty: go up and delete it
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def _remove_files(fd: int) -> list[str]:
    """Unlink every non-directory in the open directory `fd`; return its subdirectories."""
    with os.scandir(fd) as entries:  # listed first: unlinking while reading may skip some
        listed = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in listed:
        if not is_dir:
            os.unlink(name, dir_fd=fd)
    return [name for name, is_dir in listed if is_dir]
