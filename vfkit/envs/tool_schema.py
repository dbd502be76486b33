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

The same type hints check the model's arguments (`argument_validators`, `validate_arguments`):
pydantic's lax mode accepts what a JSON-writing model means ("18" for an int, 3 for a str) and
converts it (a value equal to its conversion, 3 for a float, is kept as sent); anything else is
a ToolArgumentError naming the argument and the type it needs. Parameters the schema leaves
unconstrained (no hint, Any, types it cannot express) are not checked.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from vfkit.errors import ConfigError
from vfkit.rubrics.call import func_name

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$"
)
_ARG_LINE = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI accepts as a function name
_LAX = ConfigDict(coerce_numbers_to_str=True)  # a model writing 42 for a string means "42"


class ToolArgumentError(ValueError):
    """The model's tool-call arguments could not be read, or do not fit the tool's types."""


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


def annotated(fn: Callable[..., Any]) -> Any:
    """What holds `fn`'s annotations: the function of a partial, a callable object's __call__."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isroutine(fn) or inspect.isclass(fn):
        return fn
    return type(fn).__call__


def tool_name(fn: Callable[..., Any]) -> str:
    """The name the model calls `fn` by: its __name__ (a partial's function's, a callable
    object's class name); ConfigError when OpenAI would refuse it (`<lambda>`)."""
    name = func_name(fn)
    if not TOOL_NAME.fullmatch(name):
        raise ConfigError(
            f"tool name {name!r} ({fn!r:.60}) is not a valid OpenAI tool name (letters, digits, "
            "'_' and '-', at most 64); define the tool with def, or set its __name__"
        )
    return name


def check_skip(name: str, params: Mapping[str, inspect.Parameter], skip: set[str]) -> None:
    """Hidden argument names must be parameters of the tool (a typo would hide nothing)."""
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = sorted(skip - set(params))
    if unknown and not takes_kwargs:
        raise ConfigError(
            f"tool {name!r} has no parameter(s) {unknown} to hide (args_to_skip / skip); "
            f"its parameters are {list(params)}"
        )


def visible_params(
    fn: Callable[..., Any], skip: Iterable[str] = ()
) -> list[tuple[str, inspect.Parameter, Any]]:
    """(name, parameter, type hint) of each parameter the model sets (not hidden by `skip`)."""
    skip = set(skip)
    try:
        hints = typing.get_type_hints(annotated(fn), include_extras=True)
    except Exception:  # unresolvable annotations: fall back to no type constraints
        hints = {}
    params = inspect.signature(fn).parameters
    check_skip(tool_name(fn), params, skip)
    return [
        (name, param, hints.get(name, param.annotation)) for name, param in params.items()
        if name not in skip and name not in ("self", "cls")
        and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
    ]


def argument_validators(
    fn: Callable[..., Any], skip: Iterable[str] = ()
) -> dict[str, tuple[Any, TypeAdapter[Any]]]:
    """name -> (type hint, pydantic validator) for each model-set parameter the schema types."""
    validators = {}
    for name, _, hint in visible_params(fn, skip):
        if not type_to_schema(hint):
            continue  # unconstrained in the schema: not checked either
        origin = typing.get_origin(hint)
        if hint is Iterable or origin is Iterable:  # pydantic would hand the tool a generator
            hint = list[typing.get_args(hint)[0]] if typing.get_args(hint) else list
        with contextlib.suppress(Exception):  # a type pydantic cannot validate: not checked
            validators[name] = (hint, TypeAdapter(hint, config=_LAX))
    return validators


def validate_arguments(
    tool: str, args: dict[str, Any], validators: Mapping[str, tuple[Any, TypeAdapter[Any]]]
) -> dict[str, Any]:
    """`args` with each typed value checked and converted (ToolArgumentError naming the first
    argument that does not fit)."""
    out = dict(args)
    for name, value in args.items():
        if name not in validators:
            continue
        hint, adapter = validators[name]
        try:
            converted = adapter.validate_python(value)
        except ValidationError as e:
            reason = e.errors()[0]["msg"] if e.errors() else str(e)
            raise ToolArgumentError(
                f"argument {name!r} of tool {tool!r} must be {type_name(hint)}, got {value!r:.80} "
                f"({reason})"
            ) from None
        # a value equal to its conversion stays as sent: 3 for a float stays 3 (PEP 484's
        # numeric tower), so a tool's f"{x}" reads as the model wrote it
        if converted != value:
            out[name] = converted
    return out


def type_name(hint: Any) -> str:
    """A type as the model should read it: `int`, `list[str]`, `Literal['a', 'b']`."""
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return repr(hint).replace("typing.", "")


def function_to_tool_schema(fn: Callable[..., Any], skip: Iterable[str] = ()) -> dict[str, Any]:
    """The OpenAI `tools` entry for `fn`; parameters named in `skip` are hidden from the model."""
    description, arg_docs = parse_docstring(inspect.getdoc(annotated(fn)))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param, hint in visible_params(fn, skip):
        prop = type_to_schema(hint)
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
            "name": tool_name(fn),
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
