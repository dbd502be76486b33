"""JudgeRubric: an LLM judge (any OpenAI-compatible endpoint) that reward functions can ask.

The rubric offers `judge` to its reward functions; `await judge(prompt, completion, answer,
state)` returns the judge model's text, asked once per rollout and prompt (cached in the state).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any

from openai import AsyncOpenAI, OpenAI

from vfkit.parsers.parser import Parser, message_text, messages_with_role
from vfkit.rubrics.rubric import RewardFunc, Rubric
from vfkit.types import Messages, State

DEFAULT_JUDGE_PROMPT = """Decide whether the response answers the question correctly, given the \
reference answer.

Question:
{question}

Reference answer:
{answer}

Response:
{response}

Reply with "yes" if the response is correct and "no" if it is not."""

CACHE_KEY = "judge_response"


def last_user_text(prompt: Messages) -> str:
    """The question a judge sees: the last user message of a chat prompt, or the prompt text."""
    if isinstance(prompt, str):
        return prompt
    users = messages_with_role(prompt, "user")
    return message_text(users[-1]) if users else ""


class JudgeRubric(Rubric):
    """A rubric whose reward functions may declare `judge` to ask an LLM judge.

    >>> async def judged_correct(judge, prompt, completion, answer, state) -> float:
    ...     verdict = await judge(prompt, completion, answer, state)
    ...     return 1.0 if verdict.strip().lower().startswith("yes") else 0.0
    >>> rubric = JudgeRubric(judge_client=AsyncOpenAI(api_key="x"), funcs=[judged_correct])
    >>> rubric.get_reward_func_names()
    ['judged_correct']

    `judge_prompt` is a `str.format` template with `{question}`, `{answer}` and `{response}`
    (the parser's answer of the completion).
    """

    def __init__(
        self,
        judge_client: AsyncOpenAI | OpenAI | None = None,
        judge_model: str = "gpt-4.1-nano",
        judge_prompt: str = DEFAULT_JUDGE_PROMPT,
        judge_sampling_args: dict[str, Any] | None = None,
        parser: Parser | None = None,
        funcs: Sequence[RewardFunc] | None = None,
        weights: Sequence[float] | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            judge_prompt.format(question="", answer="", response="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"judge_prompt is not a valid template ({type(exc).__name__}: {exc}); use "
                "{question}, {answer}, {response} as fields and double literal braces: {{ }}"
            ) from exc
        super().__init__(funcs=funcs, weights=weights, parser=parser, **kwargs)
        self._judge_client = judge_client
        self.judge_model = judge_model
        self.judge_prompt = judge_prompt
        self.judge_sampling_args = dict(judge_sampling_args or {})
        self.class_objects.update(
            judge=self.judge,
            judge_client=judge_client,
            judge_model=judge_model,
            judge_prompt=judge_prompt,
        )

    @property
    def judge_client(self) -> AsyncOpenAI:
        """The judge's client; by default an `AsyncOpenAI()` from the OPENAI_* environment."""
        if self._judge_client is None:
            self._judge_client = AsyncOpenAI()  # raises OpenAIError when no key is configured
            self.class_objects["judge_client"] = self._judge_client
        return self._judge_client

    async def judge(
        self,
        prompt: Messages,
        completion: Messages,
        answer: Any,
        state: State | None = None,
        **kwargs: Any,
    ) -> str:
        """The judge model's reply about this completion (cached in `state["judge_response"]`)."""
        response = self.parser.parse_answer(completion)
        text = self.judge_prompt.format(
            question=last_user_text(prompt),
            answer="" if answer is None else answer,
            response="" if response is None else response,
        )
        cache = state.setdefault(CACHE_KEY, {}) if state is not None else {}
        if text in cache:
            return cache[text]
        create = partial(self.judge_client.chat.completions.create, model=self.judge_model,
                         messages=[{"role": "user", "content": text}], **self.judge_sampling_args)
        # a sync OpenAI client (classic environments pass one) runs off the event loop
        reply = await (asyncio.to_thread(create) if isinstance(self.judge_client, OpenAI)
                       else create())
        content = reply.choices[0].message.content if reply.choices else None
        cache[text] = content or ""
        return cache[text]
