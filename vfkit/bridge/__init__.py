"""Present vfkit environments to verifiers v1 (and so to today's prime-rl) without depending on it.

verifiers v1 loads a *taskset* by id: it imports the module named after the id and takes the
`Taskset` (and, when present, `Harness` and `Env`) subclasses its `__all__` exports. A vfkit
environment package opts in with one line at the end of its module:

    __all__, __getattr__ = vfkit.bridge.v1_exports("reverse-text", load_environment)

Then `vf.load_taskset("vfkit-reverse-text")` (the module `vfkit_reverse_text`), `vf-eval
vfkit-reverse-text` and prime-rl's env server all find it. The classes are built on first access
(PEP 562 module `__getattr__`), so importing the package never imports verifiers: vfkit users
without the `vfkit[verifiers]` extra are not affected, and `__all__` names the classes only when
verifiers >= 0.4 is installed (so `from vfkit_reverse_text import *` works without it). What the
classes do is in `vfkit.bridge.v1`.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

#: The names an opted-in environment module exports for verifiers v1, besides load_environment.
V1_NAMES = ("VfkitTaskset", "VfkitHarness", "VfkitEnv")


def has_verifiers_v1() -> bool:
    """Whether verifiers >= 0.4 (the one with `verifiers.v1`) is installed; imports nothing."""
    if importlib.util.find_spec("verifiers") is None:
        return False
    try:
        version = metadata.version("verifiers")
    except metadata.PackageNotFoundError:  # importable without metadata: a checkout, say
        return True
    major_minor = [int(part) for part in re.findall(r"\d+", version)[:2]]
    return major_minor >= [0, 4]


def v1_exports(
    env_id: str, load_environment: Callable[..., Any]
) -> tuple[list[str], Callable[[str], Any]]:
    """`(__all__, __getattr__)` for an environment module: verifiers v1 classes, built lazily.

    `env_id` is the vfkit environment id (`reverse-text`); `load_environment` its builder.
    """

    def __getattr__(name: str) -> Any:
        if name not in V1_NAMES:
            raise AttributeError(f"module has no attribute {name!r}")
        from vfkit.bridge.v1 import v1_classes  # imports verifiers; explains if it is missing

        return getattr(v1_classes(env_id, load_environment), name)

    return ["load_environment", *(V1_NAMES if has_verifiers_v1() else ())], __getattr__


__all__ = ["V1_NAMES", "has_verifiers_v1", "v1_exports"]
