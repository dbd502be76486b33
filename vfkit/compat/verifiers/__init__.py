"""The classic verifiers 0.1.x API (`import verifiers as vf`) mapped onto vfkit.

Environment modules written for verifiers 0.1.x import this as `verifiers` when vfkit loads them
and the real package is not installed (see `vfkit.compat.importer`). Scripts can use it
directly:

    import vfkit.compat.verifiers as vf
    env = vf.SingleTurnEnv(dataset=rows, parser=vf.XMLParser(["think", "answer"]))
    results = env.evaluate_sync(OpenAI(base_url=..., api_key="x"), "model", num_examples=4)
    print(results["reward"])

Names of 0.1.x that vfkit does not provide (its trainer classes, sandbox and text-arena
environments) raise an AttributeError that says what to use instead.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from vfkit.compat.envs import EnvGroup, Environment, MultiTurnEnv, SingleTurnEnv, stop
from vfkit.compat.hooks import cleanup, teardown
from vfkit.compat.tool_envs import StatefulToolEnv, ToolEnv
from vfkit.compat.verifiers.types import (
    ChatMessage,
    GenerateOutputs,
    Info,
    Message,
    Messages,
    RewardFunc,
    RolloutInput,
    SamplingArgs,
    State,
)
from vfkit.envs.registry import load_environment
from vfkit.parsers.parser import Parser
from vfkit.parsers.think_parser import MaybeThinkParser, ThinkParser
from vfkit.parsers.xml_parser import XMLParser
from vfkit.rubrics.judge_rubric import JudgeRubric
from vfkit.rubrics.math_rubric import MathRubric
from vfkit.rubrics.rubric import Rubric
from vfkit.rubrics.rubric_group import RubricGroup
from vfkit.rubrics.tool_rubric import ToolRubric
from vfkit.utils.data_utils import extract_boxed_answer, extract_hash_answer, load_example_dataset

__version__ = "0.1.8"
__vfkit_compat__ = True  # marks this module as vfkit's stand-in, not the real verifiers

_LAZY = {"ReasoningGymEnv": "vfkit.compat.reasoning_gym"}

_NOT_PROVIDED = {
    "RLTrainer": "train with `vf-train run.toml` (LoRA settings in [trainer.args])",
    "RLConfig": "write the run's settings in a vf-train TOML config",
    "GRPOTrainer": "train with `vf-train run.toml`",
    "GRPOConfig": "write the run's settings in a vf-train TOML config",
    "grpo_defaults": "see configs/exp.toml for vfkit's defaults",
    "lora_defaults": "see configs/exp.toml for vfkit's defaults",
    "get_model": "vf-train loads the model named by `model =` in its config",
    "get_model_and_tokenizer": "vf-train loads the model named by `model =` in its config",
    "PythonEnv": "use vfkit's python-sandbox environment (environments/python-sandbox)",
    "SandboxEnv": "use vfkit.sandbox with a vfkit.ToolEnv",
    "TextArenaEnv": "no TextArena bridge exists in vfkit; write a vf.MultiTurnEnv",
}

__all__ = [  # ReasoningGymEnv comes from __getattr__ (reasoning-gym is optional)
    "ChatMessage",
    "EnvGroup",
    "Environment",
    "GenerateOutputs",
    "Info",
    "JudgeRubric",
    "MathRubric",
    "MaybeThinkParser",
    "Message",
    "Messages",
    "MultiTurnEnv",
    "Parser",
    "ReasoningGymEnv",
    "RewardFunc",
    "RolloutInput",
    "Rubric",
    "RubricGroup",
    "SamplingArgs",
    "SingleTurnEnv",
    "State",
    "StatefulToolEnv",
    "ThinkParser",
    "ToolEnv",
    "ToolRubric",
    "XMLParser",
    "cleanup",
    "extract_boxed_answer",
    "extract_hash_answer",
    "load_environment",
    "load_example_dataset",
    "print_prompt_completions_sample",
    "setup_logging",
    "stop",
    "teardown",
]


def print_prompt_completions_sample(
    prompts: list[Any], completions: list[Any], rewards: list[float], step: int = 0, **_: Any
) -> None:
    """Print a table of prompts, completions and rewards (classic's logging helper)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"step {step}", show_lines=True)
    for column in ("prompt", "completion", "reward"):
        table.add_column(column)
    for prompt, completion, reward in zip(prompts, completions, rewards, strict=False):
        table.add_row(_printable(prompt), _printable(completion), f"{float(reward):.3f}")
    Console().print(table)


def _printable(messages: Any) -> str:
    if isinstance(messages, list):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages
                         if isinstance(m, dict))
    return str(messages)


def setup_logging(level: str = "INFO", log_format: str | None = None,
                  date_format: str | None = None) -> None:
    """Send vfkit's log records at `level` and above to stderr (classic's logging helper)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        log_format or "%(asctime)s - %(name)s - %(levelname)s - %(message)s",
        date_format or "%Y-%m-%d %H:%M:%S",
    ))
    logger = logging.getLogger("vfkit")
    logger.handlers.clear()
    logger.setLevel(level.upper())
    logger.addHandler(handler)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _NOT_PROVIDED:
        raise AttributeError(f"verifiers.{name} (classic 0.1.x) is not provided by vfkit's "
                             f"compatibility layer: {_NOT_PROVIDED[name]}")
    raise AttributeError(f"module 'verifiers' (vfkit's classic 0.1.x layer) has no attribute "
                         f"{name!r}")
