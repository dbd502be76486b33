"""One model call of a rollout: the context budget, the call, and what it adds to the state.

`ModelCalls` is a part of `Environment` (its base class); it reads the environment's
`message_type` and `max_seq_len`. Each call becomes a trajectory step with the server's token ids
(never re-tokenized text); a multi-turn rollout notes whether each turn's prompt ids extend the
previous turn's (`vfkit.envs.trajectory`).
"""

from __future__ import annotations

import logging
from typing import Any

from openai import AsyncOpenAI

from vfkit.client.chat_call import (
    call_model,
    cap_max_tokens,
    finish_reason,
    prepare_sampling_args,
    response_message,
    response_text,
)
from vfkit.client.limits import SequenceLimits
from vfkit.client.sampling import seed_turn
from vfkit.client.tokens import parse_tokens
from vfkit.envs.trajectory import step_extends
from vfkit.errors import ContextOverflowError
from vfkit.types import Messages, SamplingArgs, State, TrajectoryStep

logger = logging.getLogger(__name__)


class ModelCalls:
    """Environment's model-call methods (overridable hooks, like the rest of Environment)."""

    message_type: str
    max_seq_len: int | None

    def known_prompt_len(self, state: State) -> int | None:
        """Tokens the next prompt has at least: the last step's prompt + completion ids."""
        if not state["trajectory"]:
            return None
        tokens = state["trajectory"][-1].get("tokens")
        return len(tokens["prompt_ids"]) + len(tokens["completion_ids"]) if tokens else None

    def mark_prompt_too_long(self, state: State) -> None:
        state["prompt_too_long"] = state["is_truncated"] = True

    async def get_model_response(
        self,
        state: State,
        prompt: Messages,
        client: AsyncOpenAI,
        model: str,
        sampling_args: SamplingArgs | None,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any] | None:
        """Call the model once; None (state marked prompt_too_long) when the context is full."""
        args = seed_turn(prepare_sampling_args(sampling_args, self.message_type), state["turn"])
        known, limits = self.known_prompt_len(state), SequenceLimits(self.max_seq_len)
        budget = None if known is None else limits.completion_budget(known)
        if budget is not None:
            if budget <= 0:
                self.mark_prompt_too_long(state)
                return None
            args = cap_max_tokens(args, budget)
        try:
            return await call_model(client, model, prompt, args, tools=tools)
        except ContextOverflowError as e:
            if e.room:  # the prompt fits, max_tokens did not: answer in the room left
                try:
                    return await call_model(client, model, prompt,
                                            cap_max_tokens(args, e.room), tools=tools)
                except ContextOverflowError as again:
                    e = again
            logger.debug("context overflow ends rollout %s: %s", state["example_id"], e)
            self.mark_prompt_too_long(state)
            return None

    def add_model_response(self, state: State, prompt: Messages, response: dict[str, Any]) -> None:
        """Record one model call: trajectory step (with token ids), completion, truncation."""
        if isinstance(prompt, str):
            completion: Messages = response_text(response)
            state["completion"] += completion
        else:
            completion = [response_message(response)]
            state["completion"].extend(completion)
        tokens = parse_tokens(response, self.max_seq_len)
        step = TrajectoryStep(prompt=prompt, completion=completion, response=response,
                              tokens=tokens, reward=None, advantage=None, extras={})
        state["trajectory"].append(step)
        state["responses"].append(response)
        state["turn"] += 1
        if tokens is not None and tokens["overlong_prompt"]:
            self.mark_prompt_too_long(state)
        if finish_reason(response) == "length" or (tokens is not None and tokens["is_truncated"]):
            state["is_truncated"] = True
        if len(state["trajectory"]) > 1:
            self.record_extension(state)

    def record_extension(self, state: State) -> None:
        """Note in state["trajectory_extends"] whether the newest step extends the previous one."""
        extends = step_extends(state["trajectory"][-2], state["trajectory"][-1])
        if extends is False and state.get("trajectory_extends") is not False:
            logger.warning(
                "rollout %s: turn %d's prompt ids do not extend the previous prompt + completion "
                "(the chat template rewrites history); train on its steps separately",
                state["example_id"], state["turn"],
            )
        if extends is not None:
            state["trajectory_extends"] = bool(state.get("trajectory_extends", True) and extends)
