"""Request bodies (OpenAI + vLLM extras) and the mapping to per-sequence sampling parameters."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vfkit.serve.errors import APIError, context_length_error
from vfkit.serve.sequence import SamplingParams

ImageParts = Literal["keep", "refuse", "drop"]  # what chat_messages does with image parts


class _SamplingRequest(BaseModel):
    """Fields shared by chat and text completions. Unknown fields are accepted and ignored
    (OpenAI's `user`, `metadata`, ...), except vLLM ones this server cannot honour, which
    `limits.refuse_unsupported` refuses by name; NaN and infinity are refused everywhere."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    n: int = Field(1, ge=1, le=128)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # {"include_usage": bool}


class ChatRequest(_SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None  # refused unless --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions (prompt: text, token ids, or a list of either)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    def logprobs_count(self) -> int | None:
        return self.logprobs

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class LoadLoraRequest(BaseModel):
    """POST /v1/load_lora_adapter."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoraRequest(BaseModel):
    """POST /v1/unload_lora_adapter."""

    model_config = ConfigDict(extra="allow")

    lora_name: str


def sampling_params(
    req: ChatRequest | CompletionRequest, prompt_len: int, max_model_len: int
) -> SamplingParams:
    """Defaults as vLLM's (temperature 1, no truncation); 400 if the prompt cannot fit."""
    wanted = req.requested_max_tokens()
    room = max_model_len - prompt_len
    if room <= 0 or (wanted is not None and wanted > room):
        raise context_length_error(max_model_len, prompt_len, wanted or 1)
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    return SamplingParams(
        max_tokens=wanted or room,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if req.top_k in (None, -1) else req.top_k,
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        stop=tuple(s for s in stop if s),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        seed=req.seed,
        logprobs=req.logprobs_count(),
        skip_special_tokens=req.skip_special_tokens,
    )


def chat_messages(
    messages: list[dict[str, Any]], *, images: ImageParts = "refuse"
) -> list[dict[str, Any]]:
    """Normalise OpenAI messages for chat templates: tool arguments as dicts, text parts joined.

    Image parts: "keep" (image models) keeps a message's parts as `{"type": "text"|"image"}`, so
    that the template puts the model's image placeholder where each image was; "refuse" (a
    text-only model) is a 400 naming the part; "drop" (the scripted test server) ignores them.
    """
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise APIError(400, "Each message needs a 'role'.", param="messages")
        message = dict(message)
        content = message.get("content")
        if not isinstance(content, str | list | None):
            raise APIError(
                400, "A message's 'content' must be a string or a list of parts.", param="messages"
            )
        if isinstance(content, list):
            parts = _content_parts(i, content, images)
            has_image = any(p["type"] == "image" for p in parts)
            message["content"] = parts if has_image else "".join(p["text"] for p in parts)
        calls = []
        for call in message.get("tool_calls") or []:
            call = json.loads(json.dumps(call))
            fn = call.get("function", {})
            if isinstance(fn.get("arguments"), str):
                with contextlib.suppress(json.JSONDecodeError):  # else the template prints it
                    fn["arguments"] = json.loads(fn["arguments"])
            calls.append(call)
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def _content_parts(i: int, content: list[Any], images: ImageParts) -> list[dict[str, Any]]:
    """Text and image parts of message `i` (other part types are ignored, as before)."""
    from vfkit.images import IMAGE_PART_TYPES, part_url

    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            continue
        field = f"messages[{i}].content[{j}]"
        if part.get("type") not in IMAGE_PART_TYPES:
            text = part.get("text", "")
            if not isinstance(text, str):
                raise APIError(400, f"{field}.text must be a string.", param=field)
            parts.append({"type": "text", "text": text})
            continue
        if images == "drop":
            continue
        if images == "refuse":
            raise APIError(
                400,
                f"{field} is an image, but the served model is text-only; send text parts only, "
                "or serve an image-text-to-text model.",
                param=field,
            )
        if part_url(part) is None:
            raise APIError(
                400, f'{field}: an image part needs {{"image_url": {{"url": "data:..."}}}}.',
                param=field,
            )
        parts.append({"type": "image"})
    return parts
