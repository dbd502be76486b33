"""Chat requests to prompt token ids: the chat template, and the limits on client templates.

A request may bring its own `chat_template` (top level, as vLLM, or inside
`chat_template_kwargs`). Template code from a client is refused unless the server was started
with `--trust-request-chat-template` (vLLM's flag). Trusted or not, a client template renders in
transformers' jinja sandbox (`ImmutableSandboxedEnvironment`) under a hard time bound: a
`range(100000)` nested in another ends with a 400 after `TEMPLATE_BUDGET_S`, not a hung worker.
Rendering and tokenizing are blocking work; the app runs them off the event loop.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vfkit.serve.errors import APIError
from vfkit.serve.protocol import ChatRequest, chat_messages

TEMPLATE_BUDGET_S = 2.0  # longest a client-supplied template may render


class _OverBudget(BaseException):
    """Raised inside the template code once the budget is spent (a BaseException, so that no
    `except Exception` on the way swallows it: the tracer is gone once it has raised)."""


def request_template(req: ChatRequest) -> str | None:
    """The template the client sent, if any (top-level `chat_template` wins)."""
    kwargs = req.chat_template_kwargs or {}
    template = req.chat_template or kwargs.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise APIError(400, "'chat_template' must be a string.", param="chat_template")
    return template


def chat_prompt_ids(tokenizer: Any, req: ChatRequest, *, trust_templates: bool) -> list[int]:
    """Render the request's messages with the chat template and tokenize them (blocking)."""
    template = request_template(req)
    if template is not None and not trust_templates:
        raise APIError(
            400,
            "This server does not run chat templates sent in requests ('chat_template'); "
            "leave the field out, or start vf-serve with --trust-request-chat-template.",
            param="chat_template",
        )
    kwargs = {k: v for k, v in (req.chat_template_kwargs or {}).items() if k != "chat_template"}
    try:
        with _time_bound(TEMPLATE_BUDGET_S if template is not None else None):
            text = tokenizer.apply_chat_template(
                chat_messages(req.messages),
                tools=req.tools or None,
                chat_template=template,
                add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message,
                tokenize=False,
                **kwargs,
            )
    except APIError:
        raise
    except _OverBudget as exc:
        raise APIError(
            400,
            f"The request's chat_template did not finish rendering within {TEMPLATE_BUDGET_S} s.",
            param="chat_template",
        ) from exc
    except Exception as exc:  # jinja errors, bad roles: the request is at fault
        param = "chat_template" if template is not None else "messages"
        raise APIError(400, f"Cannot apply the chat template: {exc}", param=param) from exc
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@contextmanager
def _time_bound(seconds: float | None) -> Iterator[None]:
    """Abort Python code run in this thread once `seconds` have passed (None: no bound).

    A trace function sees every line the compiled template executes, so even a loop that calls
    nothing is interrupted; the raised exception unwinds the template like a jinja error.
    """
    if seconds is None:
        yield
        return
    deadline = time.monotonic() + seconds

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _OverBudget
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(previous)
