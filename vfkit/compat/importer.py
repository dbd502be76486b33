"""Expose vfkit's classic surface as the module `verifiers`, only while loading a classic env.

`classic_verifiers()` puts `vfkit.compat.verifiers` (and its submodules) into `sys.modules` under
the names `verifiers`, `verifiers.types`, ... and takes them out again afterwards, so a module
written for verifiers 0.1.x imports and runs unmodified. It does nothing when a real `verifiers`
is installed: vfkit never shadows it.

    with classic_verifiers():
        module = importlib.import_module("my_classic_env")
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator

ALIASES = ("verifiers", "verifiers.types", "verifiers.utils", "verifiers.utils.data_utils")


def is_stand_in(module: object) -> bool:
    return bool(getattr(module, "__vfkit_compat__", False))


def real_verifiers_installed() -> bool:
    """True when an actual `verifiers` package can be imported (not vfkit's stand-in)."""
    loaded = sys.modules.get("verifiers")
    if loaded is not None:
        return not is_stand_in(loaded)
    try:
        return importlib.util.find_spec("verifiers") is not None
    except (ImportError, ValueError):
        return False


def missing_verifiers(error: ModuleNotFoundError) -> bool:
    """True when `error` is the failed import of verifiers itself (not installed)."""
    name = error.name or ""
    return (name == "verifiers" or name.startswith("verifiers.")) and not real_verifiers_installed()


@contextlib.contextmanager
def classic_verifiers() -> Iterator[None]:
    """Within the block, `import verifiers` gives vfkit's classic 0.1.x surface."""
    if real_verifiers_installed() or is_stand_in(sys.modules.get("verifiers")):
        yield  # the real package wins; or an outer block already set the aliases
        return
    saved = {name: sys.modules.get(name) for name in ALIASES}
    for name in ALIASES:
        sys.modules[name] = importlib.import_module(f"vfkit.compat.{name}")
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
