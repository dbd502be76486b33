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
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from functools import partial
from typing import Any

# classic modules served by a module of vfkit's stand-in of the same name
ALIASES = (
    "verifiers", "verifiers.types", "verifiers.utils", "verifiers.utils.data_utils",
    "verifiers.utils.async_utils", "verifiers.utils.tool_utils",
)
# classic packages whose modules only hold classes the top-level surface has
# (`from verifiers.envs.tool_env import ToolEnv` is `vf.ToolEnv`)
CLASS_PACKAGES = ("verifiers.envs", "verifiers.rubrics", "verifiers.parsers")


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
    saved = {name: mod for name, mod in sys.modules.items() if _classic_name(name)}
    for name in ALIASES:
        sys.modules[name] = importlib.import_module(f"vfkit.compat.{name}")
    finder = _ClassicSubmodules()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if _classic_name(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


def _classic_name(name: str) -> bool:
    return name == "verifiers" or name.startswith("verifiers.")


class _ClassicSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `verifiers.envs.*`, `verifiers.rubrics.*`, `verifiers.parsers.*` from the
    top-level surface, and refuses any other classic submodule by name (the real package's
    "No module named" would send the user to install verifiers, which cannot help)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if not _classic_name(fullname) or fullname in ALIASES:
            return None
        if any(fullname == p or fullname.startswith(p + ".") for p in CLASS_PACKAGES):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        raise ImportError(
            f"{fullname} (classic verifiers) is not provided by vfkit's compatibility layer, "
            f"which serves {', '.join(ALIASES)} and the classes of "
            f"{', '.join(p + '.*' for p in CLASS_PACKAGES)}: import the name from `verifiers` "
            "(import verifiers as vf; vf.<Name>), or see vfkit/compat/README.md", name=fullname,
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, f"{spec.name}: the classes of vfkit's classic layer")
        module.__vfkit_compat__ = True
        module.__getattr__ = partial(_from_surface, spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _from_surface(module: str, name: str) -> Any:
    """`name` from the top-level surface; an ImportError naming what to use when it has none
    (an AttributeError would become a bare "cannot import name" in `from m import name`)."""
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(sys.modules["verifiers"], name)
    except AttributeError as exc:
        raise ImportError(f"cannot import {name} from {module}: {exc}", name=module) from None
