"""The environment for a child Python process that must import extra folders."""

from __future__ import annotations

import os
from pathlib import Path


def child_env(*folders: str | Path, **extra: str) -> dict[str, str]:
    """This process's environment with `folders` ahead of its PYTHONPATH, plus `extra`.

    The caller's PYTHONPATH is kept: where vfkit's dependencies come from it (`pip install
    --target`, as on the GPU machine), a child without it cannot import them.
    """
    path = [*map(str, folders), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), **extra}
