"""Find and load environment packages by id.

An environment package is an importable module named after its id (`-` -> `_`), or that name
with a `vfkit_` prefix (vfkit's own packages, so `reverse-text` never shadows verifiers' package
of the same name), that exposes `load_environment(**kwargs) -> Environment`, optionally advertised
under the entry-point group "vfkit.environments" (name = id, value = module or "module:function"):

    env = vf.load_environment("reverse-text", max_examples=100)
"""

from __future__ import annotations

import importlib
import importlib.util
from importlib import metadata
from pathlib import Path
from typing import Any

from vfkit.errors import EnvironmentNotFoundError

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
    return EnvironmentNotFoundError(
        f"environment {env_id!r} not found ({cause}). Known environments: {listing}. "
        f"Install it with `vf-install {env_id}` (or `pip install -e environments/{env_id}`)."
    )


def _loader(env_id: str) -> Any:
    """The load_environment function of `env_id`: module `vfkit_<id>`, else the entry point,
    else module `<id>`."""
    module_name = env_id.replace("-", "_")
    prefixed = f"vfkit_{module_name}"
    if "." not in module_name and importlib.util.find_spec(prefixed) is not None:
        return getattr(importlib.import_module(prefixed), "load_environment", None)
    ep = _entry_points().get(env_id) or _entry_points().get(env_id.replace("_", "-"))
    if ep is not None:
        try:
            target = ep.load()
        except ModuleNotFoundError as e:
            if e.name != ep.module.split(".")[0]:
                raise  # the environment exists but one of its own imports is missing
            target = None  # a stale entry point (its package was renamed or removed)
        if target is not None:
            return target if callable(target) else getattr(target, "load_environment", None)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.split(".")[0] == e.name.split(".")[0]:
            raise _not_found(env_id, f"no module named {module_name!r}") from e
        raise  # the environment exists but one of its own imports is missing
    return getattr(module, "load_environment", None)


def load_environment(env_id: str, **kwargs: Any) -> Any:
    """Import the environment `env_id` and build it with `kwargs`; sets env_id / env_args."""
    loader = _loader(env_id)
    if not callable(loader):
        raise _not_found(env_id, "its module has no load_environment() function")
    env = loader(**kwargs)
    env.env_id = env.env_id or env_id
    env.env_args = dict(kwargs)
    return env
