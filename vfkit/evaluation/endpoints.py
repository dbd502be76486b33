"""The endpoint registry: short model ids mapped to a served model, a base URL and a key variable.

    # configs/endpoints.toml
    [[endpoint]]
    id = "gpt-mini"               # what you pass as -m
    model = "gpt-4.1-mini"        # the model name the server expects
    url = "https://api.openai.com/v1"
    key = "OPENAI_API_KEY"        # name of the environment variable holding the key (optional)
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from vfkit.errors import ConfigError
from vfkit.evaluation.urls import check_base_url

_FIELDS = {"id", "model", "url", "key"}


@dataclass(frozen=True)
class Endpoint:
    """One registry entry: `-m id` means `model` served at `url`, key read from env var `key`."""

    id: str
    model: str
    url: str
    key: str | None = None
    path: Path | None = field(default=None, compare=False)  # the registry file it came from

    def origin(self) -> str:
        """Where its URL was written, for messages: "endpoint 'x' in FILE"."""
        return f"endpoint {self.id!r} in {self.path}" if self.path else f"endpoint {self.id!r}"


def load_endpoints(path: Path) -> dict[str, Endpoint]:
    """Read a TOML registry of `[[endpoint]]` tables, by id; errors name the file and entry."""
    try:
        text = Path(path).read_text()
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"-e/--endpoints: no such file {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"-e/--endpoints: cannot read {path} ({exc}); pass a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"-e/--endpoints: {path} is not valid TOML: {exc}") from None
    unknown_tables = set(data) - {"endpoint"}
    if unknown_tables:
        raise ConfigError(
            f"{path}: unknown top-level key(s) {sorted(unknown_tables)}; "
            "the registry holds only [[endpoint]] tables"
        )
    entries = data.get("endpoint", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'endpoint' must be an array of tables: write [[endpoint]]")
    registry: dict[str, Endpoint] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: endpoint #{i + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{path}{_line_of_array(text)}: endpoint #{i + 1} must be a table, got "
                f"{entry!r}; write each entry as [[endpoint]] with id, model and url keys"
            )
        unknown = set(entry) - _FIELDS
        if unknown:
            allowed = ", ".join(sorted(_FIELDS))
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {allowed}")
        missing = [k for k in ("id", "model", "url") if not isinstance(entry.get(k), str)]
        if missing:
            raise ConfigError(f"{where}: missing or non-string key(s) {missing}")
        if "key" in entry and not isinstance(entry["key"], str):
            raise ConfigError(f"{where}: 'key' is the NAME of an environment variable (a string)")
        check_base_url(entry["url"], f"{where} ({entry['id']!r}): url")
        if entry["id"] in registry:
            raise ConfigError(f"{where}: id {entry['id']!r} is defined twice")
        registry[entry["id"]] = Endpoint(
            entry["id"], entry["model"], entry["url"], entry.get("key"), Path(path)
        )
    return registry


def _line_of_array(text: str) -> str:
    """' line N' of an inline `endpoint = [...]` array (where non-tables come from), or ''."""
    match = re.search(r"^[ \t]*endpoint[ \t]*=", text, flags=re.MULTILINE)
    return f" line {text.count(chr(10), 0, match.start()) + 1}" if match else ""


def find_endpoint(model: str, path: Path | None, *, default_path: Path) -> Endpoint | None:
    """Look `model` up in the registry at `path` (or `default_path` when it exists)."""
    if path is None:
        if not default_path.is_file():
            return None
        path = default_path
    return load_endpoints(path).get(model)
