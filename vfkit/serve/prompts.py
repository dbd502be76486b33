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
from functools import lru_cache
from typing import Any

from vfkit.serve.errors import APIError
from vfkit.serve.protocol import ChatRequest, CompletionRequest, ImageParts, chat_messages

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


def chat_prompt_ids(
    tokenizer: Any,
    req: ChatRequest,
    max_model_len: int,
    *,
    trust_templates: bool,
    images: ImageParts = "refuse",
) -> list[int]:
    """Render the request's messages with the chat template and tokenize them (blocking).

    For a text-only model an image part is a 400 naming it (vision.py serves image models).
    """
    messages = chat_messages(req.messages, images=images)
    text = render_chat(tokenizer, messages, req, trust_templates=trust_templates)
    check_text_fits(tokenizer, text, max_model_len)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    req: ChatRequest,
    *,
    trust_templates: bool,
    default_template: str | None = None,
) -> str:
    """The prompt text of normalised `messages` (the request's template, else the model's)."""
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
            return tokenizer.apply_chat_template(
                messages,
                tools=req.tools or None,
                chat_template=template or default_template,
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


def check_text_fits(tokenizer: Any, text: str, max_model_len: int) -> None:
    """400 before tokenizing a text that cannot fit the context whatever its tokens.

    No token stands for more than `_longest_token_bytes` bytes (x4 for normalisers that
    shrink text), so a longer text needs more tokens than the context has. Tokenizing a 20 MB
    prompt only to refuse it costs minutes of CPU and hundreds of MB of ids.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_model_len * _longest_token_bytes(tokenizer) * 4:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, the "
            f"prompt is {size} bytes long, more than that many tokens can hold. Please reduce "
            "the length of the messages or prompt.",
            param="messages",
            code="context_length_exceeded",
        )


@lru_cache(maxsize=8)
def _longest_token_bytes(tokenizer: Any) -> int:
    """Bytes of the longest vocabulary entry as written (>= the text any one token covers)."""
    return max((len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab()), default=1)


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


def completion_prompts(
    req: CompletionRequest, tokenizer: Any, max_model_len: int, image_token: int | None = None
) -> list[list[int]]:
    """Token ids of each prompt of a completions request (text is tokenized with specials);
    `image_token`: an image model's placeholder id, which a prompt here may not hold (this
    route takes no images). Blocking: call it off the event loop."""
    prompt = req.prompt
    if isinstance(prompt, str):
        prompts: list[str | list[int]] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [prompt]  # one prompt given as token ids
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError(400, "'prompt' must not be empty.", param="prompt")
    out = []
    for j, p in enumerate(prompts):
        if isinstance(p, str):
            check_text_fits(tokenizer, p, max_model_len)
        ids = tokenizer(p)["input_ids"] if isinstance(p, str) else list(p)
        if not ids:
            raise APIError(400, "A prompt is empty after tokenization.", param="prompt")
        field = "prompt" if len(prompts) == 1 else f"prompt[{j}]"
        check_token_ids(ids, len(tokenizer), image_token, field=field)
        out.append(ids)
    return out


def check_token_ids(
    token_ids: list[int], vocab_size: int, image_token: int | None, *, field: str = "token_ids"
) -> None:
    """400 naming the first id that is not a token of the served model, or that is an image
    model's placeholder (it needs image features, which token and text prompts do not carry).
    `field`: the request field the ids came from, named as field[i]."""
    for i, token_id in enumerate(token_ids):
        if not 0 <= token_id < vocab_size:
            raise APIError(
                400,
                f"{field}[{i}] = {token_id} is not a token of the served model (its vocabulary "
                f"has {vocab_size} ids, 0 to {vocab_size - 1}).",
                param=f"{field}[{i}]",
            )
        if token_id == image_token:
            raise APIError(
                400,
                f"{field}[{i}] = {token_id} is the model's image placeholder, and this route "
                "takes no images; send image prompts to /v1/chat/completions.",
                param=f"{field}[{i}]",
            )


def image_token_id(engine: Any) -> int | None:
    """The served image model's image placeholder id (None for a text model)."""
    if getattr(engine, "processor", None) is None:
        return None
    return getattr(getattr(engine, "vision", None), "image_token_id", None)
