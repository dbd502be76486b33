"""Find and load environment packages by id.

An environment package is an importable module named after its id (`-` -> `_`), or that name
with a `vfkit_` prefix (vfkit's own packages, so `reverse-text` never shadows verifiers' package
of the same name), that exposes `load_environment(**kwargs) -> Environment`, optionally advertised
under the entry-point group "vfkit.environments" (name = id, value = module or "module:function"):

    env = vf.load_environment("reverse-text", max_examples=100)

Modules written for classic verifiers 0.1.x (`import verifiers as vf`) load too, through
`vfkit.compat` (see vfkit/compat/README.md).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from vfkit.compat.importer import classic_verifiers, is_stand_in, missing_verifiers
from vfkit.errors import ConfigError, EnvironmentNotFoundError

ENTRY_POINT_GROUP = "vfkit.environments"


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _environment_folders() -> list[Path]:
    """environments/ under the working directory and next to the vfkit source checkout."""
    candidates = [Path.cwd() / "environments", Path(__file__).resolve().parents[2] / "environments"]
    return list(dict.fromkeys(p for p in candidates if p.is_dir()))


def list_environments() -> list[str]:
    """Ids of the environments found: entry points plus packages under environments/."""
    found = set(_entry_points())
    for folder in _environment_folders():
        for child in folder.iterdir():
            if child.is_dir() and (child / "pyproject.toml").exists():
                found.add(child.name.replace("_", "-"))
    return sorted(found)


def _not_found(env_id: str, cause: str) -> EnvironmentNotFoundError:
    installed = list_environments()
    listing = ", ".join(installed) if installed else "none"
    if env_id in installed:  # a package folder under environments/, not installed yet
        return EnvironmentNotFoundError(
            f"environment {env_id!r} not found ({cause}). Install it with `vf-install "
            f"{env_id}` (or `pip install -e environments/{env_id}`)."
        )
    close = difflib.get_close_matches(env_id, installed, n=1)
    guess = f" Did you mean {close[0]!r}?" if close else ""
    return EnvironmentNotFoundError(
        f"environment {env_id!r} not found ({cause}).{guess} Known environments: {listing}. "
        "Create one with `vf-init <id>`, or install a package with `vf-install <id>`."
    )


def _classic_fallback(load: Callable[[], Any]) -> Any:
    """`load()`; when it fails only because verifiers is not installed, again with vfkit's
    classic surface importable as `verifiers` (a module written for verifiers 0.1.x)."""
    try:
        return load()
    except ModuleNotFoundError as e:
        if not missing_verifiers(e):
            raise
    with classic_verifiers():
        return load()


def _import(env_id: str, module_name: str) -> Any:
    """Import the environment's module (EnvironmentNotFoundError when there is none)."""
    try:
        return _classic_fallback(lambda: importlib.import_module(module_name))
    except ModuleNotFoundError as e:
        if e.name and module_name.split(".")[0] == e.name.split(".")[0]:
            raise _not_found(env_id, f"no module named {module_name!r}") from e
        raise  # the environment exists but one of its own imports is missing


def _loader(env_id: str) -> Any:
    """The load_environment function of `env_id`: module `vfkit_<id>` (vfkit's own packages),
    else the entry point, else module `<id>`."""
    module_name = env_id.replace("-", "_")
    prefixed = f"vfkit_{module_name}"
    if "." not in module_name and importlib.util.find_spec(prefixed) is not None:
        return getattr(_import(env_id, prefixed), "load_environment", None)
    ep = _entry_points().get(env_id) or _entry_points().get(env_id.replace("_", "-"))
    if ep is not None:
        try:
            target = _classic_fallback(ep.load)
        except ModuleNotFoundError as e:
            if e.name != ep.module.split(".")[0]:
                raise  # the environment exists but one of its own imports is missing
            target = None  # a stale entry point (its package was renamed or removed)
        if target is not None:
            return target if callable(target) else getattr(target, "load_environment", None)
    module = _import(env_id, module_name)
    return getattr(module, "load_environment", None)


def _is_classic(loader: Any) -> bool:
    """True when `loader`'s module imported vfkit's classic surface as `verifiers`."""
    module = sys.modules.get(getattr(loader, "__module__", "") or "")
    if module is None:
        return False
    return any(is_stand_in(value) or str(getattr(value, "__module__", "")).startswith(
        "vfkit.compat") for value in vars(module).values())


def load_environment(env_id: str, **kwargs: Any) -> Any:
    """Import the environment `env_id` and build it with `kwargs`; sets env_id / env_args.

    A module written for classic verifiers 0.1.x loads through vfkit.compat when the real
    verifiers is not installed; when it is, the module gets the real one, and an environment
    built with it is refused (vfkit's engine cannot run it).
    """
    loader = _loader(env_id)
    if not callable(loader):
        raise _not_found(env_id, "its module has no load_environment() function")
    context = classic_verifiers() if _is_classic(loader) else contextlib.nullcontext()
    with context:  # lazy `import verifiers` inside load_environment sees the same surface
        env = loader(**kwargs)
    if type(env).__module__.split(".")[0] == "verifiers":
        raise ConfigError(
            f"environment {env_id!r} was built with the installed verifiers package, not vfkit: "
            "vfkit runs classic environments through its own compatibility layer, used only "
            "when verifiers is not installed. Run it in an environment without verifiers "
            "(pip uninstall verifiers)."
        )
    env.env_id = env.env_id or env_id
    env.env_args = dict(kwargs)
    return env
