"""OpenAI tool schemas from plain Python functions: signature types + Google-style docstrings.

    def add(a: int, b: int = 0) -> int:
        \"\"\"Add two integers.

        Args:
            a: The first number.
            b: The second number.
        \"\"\"

    function_to_tool_schema(add)
    # {"type": "function", "function": {"name": "add", "description": "Add two integers.",
    #  "parameters": {"type": "object", "properties": {"a": {"type": "integer",
    #  "description": "The first number."}, ...}, "required": ["a"]}}}
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vfkit.errors import ConfigError

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$"
)
_ARG_LINE = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def type_to_schema(tp: Any) -> dict[str, Any]:
    """JSON schema of a type annotation (unknown types: no constraint)."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return type_to_schema(options[0])
        return {"anyOf": [type_to_schema(a) for a in options]}
    if origin is typing.Annotated:
        return type_to_schema(args[0])
    if tp in (list, tuple, set) or origin in (list, tuple, set, Sequence, Iterable):
        items = type_to_schema(args[0]) if args and args[0] is not Ellipsis else {}
        return {"type": "array", **({"items": items} if items else {})}
    if tp is dict or origin in (dict, Mapping):
        return {"type": "object"}
    return {}


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {arg name: description}) from a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section, current, indent = None, None, 0
    for line in lines:
        heading = _SECTION.match(line)
        if heading:
            section, current = heading.group(1), None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            match = _ARG_LINE.match(line)
            if match and (current is None or len(match.group(1)) <= indent):
                indent, current = len(match.group(1)), match.group(2)
                args[current] = match.group(4).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args


def check_skip(name: str, params: Mapping[str, inspect.Parameter], skip: set[str]) -> None:
    """Hidden argument names must be parameters of the tool (a typo would hide nothing)."""
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = sorted(skip - set(params))
    if unknown and not takes_kwargs:
        raise ConfigError(
            f"tool {name!r} has no parameter(s) {unknown} to hide (args_to_skip / skip); "
            f"its parameters are {list(params)}"
        )


def function_to_tool_schema(fn: Callable[..., Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """The OpenAI `tools` entry for `fn`; parameters named in `skip` are hidden from the model."""
    skip = set(skip)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable annotations: fall back to no type constraints
        hints = {}
    description, arg_docs = parse_docstring(inspect.getdoc(fn))
    properties: dict[str, Any] = {}
    required: list[str] = []
    params = inspect.signature(fn).parameters
    check_skip(fn.__name__, params, skip)
    for name, param in params.items():
        if name in skip or name in ("self", "cls") or param.kind in (
            param.VAR_POSITIONAL, param.VAR_KEYWORD
        ):
            continue
        prop = type_to_schema(hints.get(name, param.annotation))
        if name in arg_docs:
            prop["description"] = arg_docs[name]
        if param.default is param.empty:
            required.append(name)
        elif param.default is None or isinstance(param.default, str | int | float | bool):
            prop["default"] = param.default
        properties[name] = prop
    return {
        "type": "function",
        "function": {
            "name": fn.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
