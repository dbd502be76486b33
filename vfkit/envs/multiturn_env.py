"""MultiTurnEnv: model and environment take turns until a stop condition holds.

Subclasses write `env_response` (the environment's reply to the model's last message) and mark
stop conditions — predicates on the state — with `@stop`:

    class Guess(vf.MultiTurnEnv):
        async def env_response(self, messages, state):
            right = messages[-1]["content"].strip() == state["answer"]
            state["solved"] = right
            return [{"role": "user", "content": "correct" if right else "try again"}]

        @vf.stop
        def solved(self, state) -> bool:
            return state.get("solved", False)

`env_response` returns a list of messages (a single message dict is taken as one), or a str in
completion mode; anything else ends the rollout with an error naming it and what it returned.
An exception in a hook or stop condition is recorded with the hook's name ("KeyError: 'board'
(raised in Guess.env_response)").

The stop condition that ended a rollout is recorded by name in state["stop_condition"].
Built-ins: prompt_too_long (context full), max_tokens_reached (last completion cut off),
max_turns_reached (`max_turns` model calls; <= 0 means no limit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from openai import AsyncOpenAI

from vfkit.envs.async_utils import INTERRUPTS, error_text, run_hook
from vfkit.envs.environment import Environment
from vfkit.errors import ConfigError
from vfkit.types import Message, Messages, SamplingArgs, State, StopCondition

logger = logging.getLogger(__name__)
StopFn = Callable[..., Any]


def stop(func: StopFn | None = None, *, priority: int = 0) -> Any:
    """Mark a method `(self, state) -> bool` (sync or async) as a stop condition.

    Conditions are checked by descending `priority`, then in definition order (base classes
    first); the first that holds names the stop condition. Use as `@stop` or `@stop(priority=5)`.
    """

    def mark(fn: StopFn) -> StopFn:
        fn.__vf_stop__ = priority  # type: ignore[attr-defined]  # marker read by MultiTurnEnv
        return fn

    return mark(func) if func is not None else mark


def checked_messages(hook: str, result: Any) -> list[Message]:
    """`result` as chat messages (a lone message dict is one); TypeError naming `hook` if it is
    not a list of dicts with a str 'role' and a 'content' (or 'tool_calls')."""
    messages = [result] if isinstance(result, dict) else result
    if isinstance(messages, list | tuple):
        bad = [i for i, m in enumerate(messages) if not isinstance(m, dict)
               or not isinstance(m.get("role"), str) or not ("content" in m or "tool_calls" in m)]
        if not bad:
            return list(messages)
        where = f" (message {bad[0]}: {messages[bad[0]]!r:.80})"
    else:
        where = ""
    raise TypeError(
        f"{hook} must return a list of messages, each a dict with 'role' and 'content' (e.g. "
        f"[{{'role': 'user', 'content': 'try again'}}]); it returned {result!r:.120}{where}"
    )


class MultiTurnEnv(Environment):
    """Alternates model turns and `env_response` until a `@stop` condition holds."""

    def __init__(self, max_turns: int = 10, **kwargs: Any) -> None:
        if not isinstance(max_turns, int) or isinstance(max_turns, bool):
            raise ConfigError(f"max_turns must be an int (model turns per rollout; <= 0 means "
                              f"no limit), not {max_turns!r}")
        super().__init__(**kwargs)
        self.max_turns = max_turns
        self.stop_conditions = self._collect_stop_conditions()

    def _collect_stop_conditions(self) -> list[tuple[str, StopFn]]:
        found: dict[str, int] = {}
        for klass in reversed(type(self).__mro__):
            for name, attr in vars(klass).items():
                if callable(attr) and hasattr(attr, "__vf_stop__"):
                    found[name] = attr.__vf_stop__  # an override without @stop stays a stop
        ordered = sorted(enumerate(found.items()), key=lambda item: (-item[1][1], item[0]))
        return [(name, getattr(self, name)) for _, (name, _) in ordered]

    # ----- built-in stop conditions -----
    @stop(priority=100)
    def prompt_too_long(self, state: State) -> bool:
        return bool(state.get("prompt_too_long"))

    @stop(priority=90)
    def max_tokens_reached(self, state: State) -> bool:
        return bool(state.get("is_truncated"))

    @stop(priority=-100)
    def max_turns_reached(self, state: State) -> bool:
        return self.max_turns > 0 and state["turn"] >= self.max_turns

    async def is_completed(self, state: State) -> bool:
        """True when a stop condition holds; records its name in state["stop_condition"]."""
        if state.get("error"):
            state["stop_condition"] = StopCondition.ERROR.value
            return True
        for name, fn in self.stop_conditions:
            if await run_hook(f"stop condition {name!r}", fn, state):
                state["stop_condition"] = name
                return True
        return False

    # ----- hooks -----
    async def setup_state(self, state: State) -> State:
        """Prepare per-rollout resources before the first turn (override; default: nothing)."""
        return state

    async def env_response(self, messages: Messages, state: State) -> Any:
        """The environment's reply to the conversation so far: messages, or (messages, state)."""
        raise NotImplementedError(f"{type(self).__name__} must implement env_response()")

    def tools_for(self, state: State) -> list[dict[str, Any]] | None:
        """OpenAI tool schemas to send with each model call (ToolEnv overrides)."""
        return None

    def current_prompt(self, state: State) -> Messages:
        """What the model sees next: the prompt plus everything said since."""
        if isinstance(state["prompt"], str):
            return state["prompt"] + state["completion"]
        return [*state["prompt"], *state["completion"]]

    async def add_env_response(self, state: State) -> None:
        """Ask `env_response` for its reply and append it to the completion."""
        hook = f"{type(self).__name__}.env_response"
        result = await run_hook(hook, self.env_response, self.current_prompt(state), state)
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
            result, new_state = result
            if new_state is not state:
                state.update(new_state)
        if result is None or (isinstance(result, list | tuple | str) and not result):
            return
        if isinstance(state["completion"], str):
            if not isinstance(result, str):
                raise TypeError(f"{hook} must return a str in completion mode (the text added "
                                f"to the prompt); it returned {result!r:.120}")
            state["completion"] += result
        else:
            state["completion"].extend(checked_messages(hook, result))

    async def completed(self, state: State) -> bool:
        """`is_completed`, with an exception noted as the hook's (it may be overridden)."""
        return bool(await run_hook(f"{type(self).__name__}.is_completed", self.is_completed, state))

    # ----- the loop -----
    async def rollout(
        self, input: dict[str, Any], client: AsyncOpenAI, model: str, sampling_args: SamplingArgs
    ) -> State:
        """Model turn, stop check, environment turn, stop check, ... (errors end it, recorded)."""
        state = self.init_state(input)
        try:
            hook = f"{type(self).__name__}.setup_state"
            state = await run_hook(hook, self.setup_state, state) or state
            while not await self.completed(state):
                if state["turn"] > 0:
                    await self.add_env_response(state)
                    if await self.completed(state):
                        break
                prompt = self.current_prompt(state)
                response = await self.get_model_response(
                    state, prompt, client, model, sampling_args, tools=self.tools_for(state)
                )
                if response is not None:
                    self.add_model_response(state, prompt, response)
                elif not state.get("prompt_too_long"):  # no reply must not loop forever
                    self.mark_prompt_too_long(state)
        except INTERRUPTS:
            raise
        except BaseException as e:  # recorded with everything gathered so far (SystemExit too)
            logger.warning("rollout of example %s failed: %s", state["example_id"], error_text(e))
            state["error"], state["stop_condition"] = error_text(e), StopCondition.ERROR.value
        return state
