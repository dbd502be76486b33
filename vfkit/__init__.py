"""vfkit: environments, parsers and rubrics for LLM RL, plus a LoRA trainer.

Public names are imported lazily so that `import vfkit` stays light (the SDK never imports torch).

    import vfkit as vf
    env = vf.load_environment("reverse-text")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # environments
    "Environment": "vfkit.envs.environment",
    "SingleTurnEnv": "vfkit.envs.singleturn_env",
    "MultiTurnEnv": "vfkit.envs.multiturn_env",
    "stop": "vfkit.envs.multiturn_env",
    "ToolEnv": "vfkit.envs.tool_env",
    "StatefulToolEnv": "vfkit.envs.stateful_tool_env",
    "EnvGroup": "vfkit.envs.env_group",
    "GenerateOutputs": "vfkit.envs.environment",
    "load_environment": "vfkit.envs.registry",
    "list_environments": "vfkit.envs.registry",
    # parsers
    "Parser": "vfkit.parsers.parser",
    "XMLParser": "vfkit.parsers.xml_parser",
    "ThinkParser": "vfkit.parsers.think_parser",
    "MaybeThinkParser": "vfkit.parsers.think_parser",
    "extract_boxed_answer": "vfkit.parsers.utils",
    # rubrics
    "Rubric": "vfkit.rubrics.rubric",
    "RubricGroup": "vfkit.rubrics.rubric_group",
    "JudgeRubric": "vfkit.rubrics.judge_rubric",
    "ToolRubric": "vfkit.rubrics.tool_rubric",
    "MathRubric": "vfkit.rubrics.math_rubric",
    "CuriosityRubric": "vfkit.rubrics.curiosity",
    # types and errors
    "State": "vfkit.types",
    "Messages": "vfkit.types",
    "TrajectoryStep": "vfkit.types",
    "TokenFields": "vfkit.types",
    "StopCondition": "vfkit.types",
    "VfkitError": "vfkit.errors",
    "ConfigError": "vfkit.errors",
    "EnvironmentNotFoundError": "vfkit.errors",
    "ServerError": "vfkit.errors",
    "RolloutError": "vfkit.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vfkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs
    from vfkit.envs.env_group import EnvGroup
    from vfkit.envs.environment import Environment, GenerateOutputs
    from vfkit.envs.multiturn_env import MultiTurnEnv, stop
    from vfkit.envs.registry import list_environments, load_environment
    from vfkit.envs.singleturn_env import SingleTurnEnv
    from vfkit.envs.stateful_tool_env import StatefulToolEnv
    from vfkit.envs.tool_env import ToolEnv
    from vfkit.parsers.parser import Parser
    from vfkit.parsers.think_parser import MaybeThinkParser, ThinkParser
    from vfkit.parsers.utils import extract_boxed_answer
    from vfkit.parsers.xml_parser import XMLParser
    from vfkit.rubrics.curiosity import CuriosityRubric
    from vfkit.rubrics.judge_rubric import JudgeRubric
    from vfkit.rubrics.math_rubric import MathRubric
    from vfkit.rubrics.rubric import Rubric
    from vfkit.rubrics.rubric_group import RubricGroup
    from vfkit.rubrics.tool_rubric import ToolRubric
