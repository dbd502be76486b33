"""Config errors that point at the TOML line and suggest the nearest valid key."""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from vfkit.errors import ConfigError
from vfkit.train.config_fields import REDACTED, SECRET_KEYS

_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_PART = r"(?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')"
_KEY = re.compile(rf"^\s*({_PART}(?:\s*\.\s*{_PART})*)\s*=")


def _split_key(key: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in key.split("."))


class ConfigSource:
    """Where each key of a config came from: a TOML line, or a command-line override."""

    def __init__(self, text: str = "", name: str = "<config>") -> None:
        self.name = name
        self.lines: dict[tuple[str, ...], int] = {}
        self.overridden: set[tuple[str, ...]] = set()
        table: tuple[str, ...] = ()
        for number, line in enumerate(text.splitlines(), start=1):
            if header := _HEADER.match(line):
                table = _split_key(header.group(1))
                self.lines.setdefault(table, number)
            elif key := _KEY.match(line):
                self.lines.setdefault(table + _split_key(key.group(1)), number)

    def where(self, path: tuple[str, ...]) -> str:
        """`file:line` of the key (or its nearest enclosing table), or 'command-line override'."""
        if path in self.overridden:
            return f"command-line override {'.'.join(path)}"
        for end in range(len(path), 0, -1):
            if (line := self.lines.get(path[:end])) is not None:
                return f"{self.name}:{line}"
        return self.name

    def error(self, path: tuple[str, ...], message: str) -> ConfigError:
        """A ConfigError naming the key, its location and what is wrong."""
        return ConfigError(f"{self.where(path)}: {'.'.join(path)}: {message}")


def _section_model(root: type[BaseModel], path: tuple[str, ...]) -> type[BaseModel] | None:
    """The config class that holds the last key of `path` (None inside free-form dicts)."""
    model: type[BaseModel] = root
    for part in path[:-1]:
        field = model.model_fields.get(part)
        if field is None:
            return None
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _data_path(loc: tuple[Any, ...], data: dict[str, Any], missing: bool) -> tuple[str, ...]:
    """The prefix of a pydantic error location that names real keys (drops union-branch tags)."""
    path: list[str] = []
    node: Any = data
    for part in loc:
        if not isinstance(node, dict):
            break
        if part not in node:
            if missing:
                path.append(str(part))
            break
        path.append(str(part))
        node = node[part]
    return tuple(path)


def validation_error(
    exc: ValidationError, data: dict[str, Any], source: ConfigSource, root: type[BaseModel]
) -> ConfigError:
    """Turn pydantic's errors into one ConfigError listing each wrong key with line and hint."""
    messages: dict[tuple[str, ...], str] = {}
    for err in exc.errors():
        path = _data_path(tuple(err["loc"]), data, err["type"] == "missing")
        where, dotted = source.where(path), ".".join(path)
        if err["type"] == "extra_forbidden":
            model = _section_model(root, path)
            valid = list(model.model_fields) if model else []
            close = difflib.get_close_matches(path[-1], valid, n=1, cutoff=0.5)
            hint = f'did you mean "{close[0]}"?' if close else f"valid keys: {', '.join(valid)}"
            messages[path] = f"{where}: unknown key {dotted} — {hint}"
        elif err["type"] == "missing":
            table = ".".join(path[:-1]) or "the top level"
            messages[path] = f"{where}: missing key {dotted} (add it to [{table}])"
        elif path in messages:  # another branch of a union type: "a list or 'all-linear'"
            messages[path] += f", or {err['msg'].removeprefix('Input should be ')}"
        else:
            reason = err["msg"].removeprefix("Value error, ")
            messages[path] = f"{where}: {dotted}{_shown(path, err.get('input'))}: {reason}"
    return ConfigError("\n".join(messages.values()))


def _shown(path: tuple[str, ...], value: Any) -> str:
    """` = value` for an error message: secrets hidden, a whole table left out (its validator
    names the key at fault, and the table may hold other secrets)."""
    if path and path[-1] in SECRET_KEYS:
        return f" = {REDACTED}"
    return "" if isinstance(value, dict) else f" = {value!r}"
