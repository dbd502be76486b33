"""One model call over the OpenAI protocol, asking for the token ids and logprobs training needs.

    response = await call_model(client, "my-model", [{"role": "user", "content": "hi"}],
                                {"max_tokens": 64, "temperature": 1.0})
    message = response_message(response)        # {"role": "assistant", "content": ..., ...}

Retries and backoff are the openai client's own (429/5xx/connection errors, Retry-After honoured);
callers bound them with `client.with_options(timeout=..., max_retries=...)`. A prompt that does not
fit the model's context raises `ContextOverflowError` instead of a generic 400.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import openai

from vfkit.client.sampling import normalize_sampling_args
from vfkit.errors import ContextOverflowError
from vfkit.types import Message, Messages, SamplingArgs

# vLLM's wordings for "the prompt (+ max_tokens) does not fit" (older and newer versions).
OVERFLOW_MARKERS = (
    "maximum context length",
    "maximum model length",
    "context length is",
    "prompt is too long",
)

def is_context_overflow(error: BaseException) -> bool:
    """True when a server error says the prompt (plus max_tokens) exceeds the model's context."""
    if not isinstance(error, openai.BadRequestError):
        return False
    text = str(error).lower()
    return any(marker in text for marker in OVERFLOW_MARKERS)


_CONTEXT = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT = re.compile(r"(\d+) in the messages|has (\d+) input tokens|(\d+) in the prompt")


def context_room(message: str) -> int | None:
    """Completion tokens left after the prompt, from vLLM's (and vf-serve's) overflow message
    ("maximum context length is 4096 tokens ... (80 in the messages, 5000 in the completion)");
    None when it does not say how long the prompt is."""
    context, prompt = _CONTEXT.search(message), _PROMPT.search(message)
    if context is None or prompt is None:
        return None
    used = next(int(g) for g in prompt.groups() if g is not None)
    return max(0, int(context.group(1)) - used)


def prepare_sampling_args(sampling_args: SamplingArgs | None, message_type: str) -> SamplingArgs:
    """The request's sampling args (see client/sampling.py), asking for token ids + logprobs."""
    args = normalize_sampling_args(sampling_args)
    extra = args.setdefault("extra_body", {})
    extra.setdefault("return_token_ids", True)
    if message_type == "chat":
        args.setdefault("logprobs", True)
    elif args.get("logprobs") in (None, True, False):
        args["logprobs"] = 1  # completions take an int: top-k count; the sampled token comes too
    return args


def cap_max_tokens(args: SamplingArgs, remaining: int) -> SamplingArgs:
    """Limit max_tokens (or max_completion_tokens) so prompt + completion fits `remaining` more."""
    key = "max_completion_tokens" if "max_completion_tokens" in args else "max_tokens"
    current = args.get(key)
    return {**args, key: remaining if current is None else min(current, remaining)}


def for_create(create: Callable[..., Any], args: SamplingArgs) -> SamplingArgs:
    """`args` with every key the openai SDK's `create` does not take moved into extra_body:
    the server's own knobs (vLLM's `cache_salt`, `chat_template_kwargs`, ...) reach it in the
    body, as prime-rl and verifiers send them, instead of failing every call in the SDK."""
    known = _keywords(getattr(create, "__func__", create))  # cached per SDK function
    unknown = {k: v for k, v in args.items() if k not in known}
    if not unknown:
        return args
    out = {k: v for k, v in args.items() if k in known}
    out["extra_body"] = {**unknown, **dict(args.get("extra_body") or {})}
    return out


@functools.cache
def _keywords(create: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(create).parameters)


async def call_model(
    client: openai.AsyncOpenAI,
    model: str,
    prompt: Messages,
    sampling_args: SamplingArgs,
    *,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Send one chat (list prompt) or completion (str prompt) request; return the response dict.

    `sampling_args` should come from `prepare_sampling_args`. Raises ContextOverflowError when the
    server reports the prompt too long; other openai errors propagate after the client's retries.
    """
    try:
        if isinstance(prompt, str):
            create = client.completions.create
            response = await create(model=model, prompt=prompt, **for_create(create, sampling_args))
        else:
            create = client.chat.completions.create
            extra = {"tools": tools} if tools else {}
            response = await create(
                model=model, messages=prompt, **extra, **for_create(create, sampling_args)
            )
    except openai.BadRequestError as e:
        if is_context_overflow(e):
            raise ContextOverflowError(str(e), room=context_room(str(e))) from e
        raise
    return response.model_dump()


def response_message(response: dict[str, Any]) -> Message:
    """The assistant message of a chat response's first choice, without empty fields."""
    msg = response["choices"][0]["message"]
    calls = msg.get("tool_calls")
    # content may be None only beside tool calls (servers reject a bare None otherwise)
    content = msg.get("content")
    out: Message = {"role": "assistant", "content": content if content or calls else ""}
    if calls:
        out["tool_calls"] = [
            {"id": c["id"], "type": c.get("type") or "function",
             "function": {"name": c["function"]["name"],
                          "arguments": c["function"]["arguments"]}}
            for c in calls
        ]
    return out


def response_text(response: dict[str, Any]) -> str:
    """The generated text of a completions response's first choice."""
    return response["choices"][0].get("text") or ""


def finish_reason(response: dict[str, Any]) -> str | None:
    return response["choices"][0].get("finish_reason")
