"""`verifiers.utils.tool_utils` of 0.1.x: a Python function as an OpenAI tool schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vfkit.envs.tool_schema import function_to_tool_schema

__all__ = ["convert_func_to_oai_tool"]


def convert_func_to_oai_tool(func: Callable[..., Any]) -> dict[str, Any]:
    """`{"type": "function", "function": {name, description, parameters}}` from the function's
    signature, type hints and docstring, as vfkit's ToolEnv builds it."""
    return function_to_tool_schema(func)
