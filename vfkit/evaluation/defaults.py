"""Per-environment eval defaults from the environment package's pyproject.toml.

    # environments/reverse-text/pyproject.toml
    [tool.vfkit.eval]            # [tool.verifiers.eval] is read too (classic verifiers packages)
    num_examples = 20
    rollouts_per_example = 4
"""

from __future__ import annotations

import importlib.util
import logging
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from vfkit.errors import ConfigError

log = logging.getLogger(__name__)

_KEYS = ("num_examples", "rollouts_per_example")


def _registry_modules(env_id: str) -> list[str]:
    """The modules `load_environment(env_id)` tries, in its order (vfkit/envs/registry.py):
    `vfkit_<id>` (vfkit's own packages), the entry point's module, then `<id>` itself."""
    from vfkit.envs.registry import ENTRY_POINT_GROUP

    module = env_id.replace("-", "_")
    names = [f"vfkit_{module}"] if "." not in module else []
    points = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    ep = points.get(env_id) or points.get(env_id.replace("_", "-"))
    if ep is not None:
        names.append(ep.module)
    names.append(module)
    return list(dict.fromkeys(names))


def _pyproject_near(origin: str) -> Path | None:
    """The pyproject.toml beside a module file (or a level or two above a package's)."""
    for folder in list(Path(origin).resolve().parents)[:3]:
        if folder.name in ("site-packages", "dist-packages"):
            break
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    return None


def find_env_pyproject(env_id: str, *, search_root: Path | None = None) -> Path | None:
    """The pyproject.toml of the package that provides `env_id`, or None when there is none.

    The module is the one the registry loads (`vfkit_reverse_text` for reverse-text), so the
    answer does not depend on the working folder; environments/<id>/ under `search_root` (the
    working folder) is the fallback for a package that is not installed.
    """
    for name in _registry_modules(env_id):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        if spec.origin and spec.origin not in ("built-in", "frozen"):
            found = _pyproject_near(spec.origin)
            if found is not None:
                return found
        break  # the registry loads this module: another module's pyproject is not its own
    root = search_root or Path.cwd()
    module = env_id.replace("-", "_")
    for name in dict.fromkeys((env_id, module)):
        candidate = root / "environments" / name / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def read_eval_defaults(pyproject: Path) -> dict[str, int]:
    """num_examples / rollouts_per_example from [tool.vfkit.eval], then [tool.verifiers.eval]."""
    try:
        data = tomllib.loads(pyproject.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{pyproject} is not valid TOML: {exc}") from None
    tool = data.get("tool", {})
    tables = [("tool.vfkit.eval", tool.get("vfkit", {}).get("eval", {}))]
    tables.append(("tool.verifiers.eval", tool.get("verifiers", {}).get("eval", {})))
    found: dict[str, int] = {}
    for name, table in tables:
        if not isinstance(table, dict):
            raise ConfigError(f"{pyproject}: [{name}] must be a table")
        for key, value in table.items():
            if key not in _KEYS:
                log.warning("%s: [%s] key %r is not used by vf-eval (known: %s)",
                            pyproject, name, key, ", ".join(_KEYS))
                continue
            lowest = -1 if key == "num_examples" else 1  # -n -1 means every example
            is_int = isinstance(value, int) and not isinstance(value, bool)
            if not is_int or value == 0 or value < lowest:
                raise ConfigError(f"{pyproject}: [{name}] {key} must be a positive integer")
            found.setdefault(key, value)
    return found


def eval_defaults(env_id: str, *, search_root: Path | None = None) -> dict[str, Any]:
    """The eval defaults an environment's package declares ({} when it declares none)."""
    pyproject = find_env_pyproject(env_id, search_root=search_root)
    return read_eval_defaults(pyproject) if pyproject else {}
