"""verifiers v1 classes around one vfkit environment (needs the `vfkit[verifiers]` extra).

How the two models line up:
- **Taskset** (`VfkitTaskset`): the vfkit dataset's rows become tasks. Each task's data carries
  the row verbatim (`row`) and the `load_environment` arguments that made it (`env_args`), so an
  env-server worker that only receives task data rebuilds the same environment.
- **Harness** (`VfkitHarness`): the episode runs vfkit's own rollout in-process: its turns,
  `env_response`, tools and stop conditions, with every model call sent through the v1
  interception endpoint, which records the trace (messages, and in training token ids / masks /
  logprobs) exactly as for any other harness.
- **Task scoring** (`VfkitTask.vfkit_rubric`): the vfkit rubric scores the rollout; each reward
  function becomes a trace reward with its weight (so `trace.reward` equals vfkit's reward) and
  zero-weight functions become metrics.
- **Env** (`VfkitEnv`): v1's single-agent env, with the harness running on the host
  (subprocess runtime) by default, since the harness executes no model-written code.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

from openai import AsyncOpenAI
from pydantic import Field

try:
    import verifiers.v1 as vf
    from verifiers.v1.runtimes import ProgramResult, SubprocessConfig
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "vfkit's verifiers v1 bridge needs verifiers>=0.4 (`import verifiers.v1` failed: "
        f"{e}); install it with `pip install 'vfkit[verifiers]'`"
    ) from e

from vfkit.envs.dataset import replace_system_prompt
from vfkit.envs.environment import Environment
from vfkit.errors import VfkitError
from vfkit.rubrics.rubric import ERRORS_METRIC

Loader = Callable[..., Environment]

#: Rollout states the harness hands to scoring, by trace id (same worker, same episode).
_ROLLOUT_STATES: dict[str, dict[str, Any]] = {}


@functools.cache
def _cached_env(loader: Loader, args_json: str) -> Environment:
    return loader(**json.loads(args_json))


def vfkit_env(loader: Loader, args: dict[str, Any]) -> Environment:
    """The vfkit environment `loader(**args)`, built once per process and argument set."""
    return _cached_env(loader, json.dumps(args, sort_keys=True))


class VfkitTaskData(vf.TaskData):
    """A vfkit dataset row as v1 task data (`prompt`/`system_prompt` are for display)."""

    row: dict[str, Any]
    """The vfkit row verbatim: prompt, answer, info, task, example_id."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """The `load_environment` keyword arguments of the environment the row came from."""


class VfkitTasksetConfig(vf.TasksetConfig):
    """Which vfkit rows load (`--env.taskset.args`, `--env.taskset.split`, ...)."""

    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the vfkit environment's `load_environment`."""
    split: Literal["train", "eval"] = "train"
    """Which vfkit dataset: `get_dataset()` (train) or `get_eval_dataset()` (eval)."""
    num_examples: int = -1
    """How many rows (-1: all)."""


def _display_prompt(prompt: Any) -> dict[str, Any]:
    """TaskData `prompt`/`system_prompt` from a vfkit prompt (a leading system message split)."""
    if isinstance(prompt, str) or not prompt:
        return {"prompt": prompt}
    messages = [{k: v for k, v in dict(m).items() if v is not None} for m in prompt]
    first = messages[0]
    if first.get("role") == "system" and isinstance(first.get("content"), str):
        return {"system_prompt": first["content"], "prompt": messages[1:]}
    return {"prompt": messages}


class VfkitTask(vf.Task[VfkitTaskData]):
    """One vfkit row; scored by the vfkit environment's rubric."""

    loader: ClassVar[Loader]
    env_id: ClassVar[str]

    @vf.reward
    async def vfkit_rubric(self, trace: vf.Trace) -> dict[str, float]:
        """Score with the vfkit rubric; records each reward function itself (own weights)."""
        env = vfkit_env(self.loader, self.data.env_args)
        state = _ROLLOUT_STATES.pop(trace.id, None) or state_from_trace(env, self.data.row, trace)
        await env.rubric.score_rollout(state)
        if state.get("error"):
            raise VfkitError(f"vfkit environment {self.env_id!r}: scoring failed: "
                             f"{state['error']}")
        record_scores(trace, env, state)
        return {}  # everything is recorded above, under the vfkit function names


def record_scores(trace: vf.Trace, env: Environment, state: dict[str, Any]) -> None:
    """vfkit's scores onto the trace: weighted functions as rewards, the rest as metrics, so
    that trace.reward is vfkit's reward. Two functions of one name (a RubricGroup of two format
    rewards) share one metric, so no name can carry its weight: the trace then gets vfkit's
    reward itself, as `reward`, and every function as a metric."""
    rubric, metrics = env.rubric, state["metrics"]
    names = rubric.get_reward_func_names()
    weights = dict(zip(names, rubric.get_reward_weights(), strict=True))
    unique = len(set(names)) == len(names)
    if not unique:
        trace.record_reward("reward", float(state["reward"]), 1.0)
    for name, value in metrics.items():
        if unique and weights.get(name):
            trace.record_reward(name, value, weights[name])
        elif name != ERRORS_METRIC:
            trace.record_metric(name, value)


def state_from_trace(env: Environment, row: dict[str, Any], trace: vf.Trace) -> dict[str, Any]:
    """A vfkit state rebuilt from a trace another harness produced: the messages after the
    prompt, with their images, tool calls and tool results, so that rubrics which count tool
    calls or read a tool's answer score the episode as they would have scored vfkit's own."""
    state = env.init_state(dict(row))
    state["is_truncated"] = bool(getattr(trace, "is_truncated", False))  # newer v1 traces
    if isinstance(state["prompt"], str):
        state["completion"] = trace.last_reply or ""
        return state
    state["completion"] = [chat_message(m) for m in trace.messages[len(state["prompt"]):]]
    return state


def chat_message(message: vf.Message) -> dict[str, Any]:
    """A v1 message as the OpenAI chat message vfkit's parsers and rubrics read."""
    out: dict[str, Any] = {"role": message.role, "content": _content(message.content)}
    calls = [_tool_call(c) for c in getattr(message, "tool_calls", None) or []]
    if calls:
        out["tool_calls"] = calls
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
        if message.name:
            out["name"] = message.name
    return out


def _content(content: Any) -> Any:
    """Text as a string; content with images as OpenAI content parts (text and image_url)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = [part.model_dump() for part in content]
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _tool_call(call: Any) -> dict[str, Any]:
    """A v1 ToolCall in OpenAI's shape: function calls carry `arguments`, custom tools `input`."""
    if call.type == "custom":
        return {"id": call.id, "type": "custom",
                "custom": {"name": call.name, "input": call.arguments}}
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


class VfkitTaskset(vf.Taskset[VfkitTask, VfkitTasksetConfig]):
    """The vfkit environment's dataset as v1 tasks."""

    loader: ClassVar[Loader]

    def load(self) -> Iterator[VfkitTask]:
        """One task per vfkit row of the configured split."""
        env = vfkit_env(self.loader, self.config.args)
        n = self.config.num_examples
        rows = env.get_dataset(n) if self.config.split == "train" else env.get_eval_dataset(n)
        task_cls = self.task_type()
        data_cls = task_cls.data_type()
        for row in rows:
            data = data_cls(row=dict(row), env_args=dict(self.config.args),
                            id=str(row.get("example_id")), **_display_prompt(row["prompt"]))
            yield task_cls(data, self.config.task)


class VfkitHarness(vf.Harness[vf.HarnessConfig]):
    """Runs vfkit's rollout in-process; every model call goes through the v1 interception."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    loader: ClassVar[Loader]
    env_id: ClassVar[str]

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: Any, endpoint: str,
                     secret: str, mcp_urls: dict[str, str], data: vf.TaskData,
                     tool_interception_url: str | None = None) -> ProgramResult:
        """One vfkit rollout of the task's row; a rollout error fails the trace."""
        row, env_args = getattr(data, "row", None), getattr(data, "env_args", {})
        if row is None:
            raise vf.HarnessError(f"harness {self.config.id!r} runs vfkit tasks only; "
                                  f"{type(data).__name__} has no `row`")
        env = vfkit_env(self.loader, env_args)
        if system := getattr(data, "system_prompt", None):  # the taskset's override (GEPA)
            row = {**row, "prompt": replace_system_prompt(row["prompt"], system)}
        sampling = ctx.sampling.model_dump(exclude_none=True) if ctx.sampling else {}
        async with AsyncOpenAI(base_url=endpoint, api_key=secret) as client:
            state = await env.run_rollout(dict(row), client, ctx.model, sampling, score=False)
        if state.get("error"):
            raise vf.HarnessError(f"vfkit environment {self.env_id!r}: rollout failed: "
                                  f"{state['error']}")
        _ROLLOUT_STATES[trace.id] = state
        if state.get("stop_condition"):
            trace.stop(str(state["stop_condition"]))
        return ProgramResult(exit_code=0, stdout="", stderr="")

    async def cleanup(self, trace: vf.Trace, runtime: Any) -> None:
        """Forget the rollout state of a trace whose scoring never ran."""
        _ROLLOUT_STATES.pop(trace.id, None)


class VfkitEnvConfig(vf.SingleAgentEnvConfig):
    """The single `agent` seat, on the host by default (the harness runs no model code)."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig())


class VfkitEnv(vf.Env[VfkitEnvConfig]):
    """v1's single-agent episode: one vfkit rollout per task."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


class V1Classes:
    """The exported classes of one vfkit environment (see `vfkit.bridge.v1_exports`)."""

    def __init__(self, env_id: str, loader: Loader) -> None:
        attrs = {"loader": staticmethod(loader), "env_id": env_id,
                 "__module__": loader.__module__}
        task_cls = type("VfkitTask", (VfkitTask,), attrs)
        self.VfkitTaskset = type("VfkitTaskset", (VfkitTaskset,), {
            **attrs, "task_type": classmethod(lambda cls: task_cls)})
        self.VfkitHarness = type("VfkitHarness", (VfkitHarness,), attrs)
        self.VfkitEnv = type("VfkitEnv", (VfkitEnv,), {"__module__": loader.__module__})


@functools.cache
def v1_classes(env_id: str, loader: Loader) -> V1Classes:
    """The classes for `env_id`, made once per process (v1 compares classes by identity)."""
    return V1Classes(env_id, loader)
