"""Request bodies (OpenAI + vLLM extras) and the mapping to per-sequence sampling parameters."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vfkit.serve.errors import APIError, context_length_error
from vfkit.serve.sequence import SamplingParams

ImageParts = Literal["keep", "refuse", "drop"]  # what chat_messages does with image parts
# Stop strings are matched against the text after every token (and, when streaming, each one's
# prefixes): a bounded list keeps one request from stalling every other (150,000 stops once
# held /health for 25 s). OpenAI allows 4; clients of an RL server send a handful.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 512
_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_lone_surrogates(body: Any) -> None:
    """400 naming the first string of a parsed JSON body that holds a lone UTF-16 surrogate
    (JSON's "\\ud800" escapes parse into one; no tokenizer or encoder takes it)."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            strings = [value]
        elif isinstance(value, dict):
            strings = [k for k in value if isinstance(k, str)]
            stack += [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):  # token id lists are long: only strings and containers
            strings = []
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(value)
                      if isinstance(v, str | dict | list)]
        else:
            continue
        if any(_SURROGATE.search(s) for s in strings):
            field = path.encode("utf-8", "replace").decode() or "body"
            raise APIError(
                400, f"{field} holds a lone UTF-16 surrogate (invalid Unicode); send valid "
                "UTF-8 text.", param=field,
            )


class RequestBody(BaseModel):
    """Any JSON body this server takes: strings must be valid Unicode (checked before the
    fields, so that no route meets a lone surrogate in a tokenizer or a path)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        refuse_lone_surrogates(data)
        return data


class _SamplingRequest(RequestBody):
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
    # below ~1e-2 the penalty divides logits into infinities (NaN probabilities)
    repetition_penalty: float | None = Field(None, ge=0.01)
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

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> _SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only valid with stream=true (vLLM's rule).",
                           param="stream_options")
        return self

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise APIError(
                400, f"stop: at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} "
                f"characters each (got {len(stops)}, the longest {max(map(len, stops))}).",
                param="stop",
            )
        return stop


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

    @model_validator(mode="after")
    def _consistent(self) -> ChatRequest:
        """400 for combinations that would otherwise be served without what they ask for."""
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true.", param="top_logprobs")
        if self.continue_final_message and "add_generation_prompt" in self.model_fields_set \
                and self.add_generation_prompt:
            raise APIError(
                400, "continue_final_message and add_generation_prompt cannot both be true; "
                "send add_generation_prompt=false.", param="add_generation_prompt",
            )
        check_tool_choice(self.tool_choice)
        return self

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


class LoadLoraRequest(RequestBody):
    """POST /v1/load_lora_adapter."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoraRequest(RequestBody):
    """POST /v1/unload_lora_adapter."""

    model_config = ConfigDict(extra="allow")

    lora_name: str


def check_tool_choice(choice: str | dict[str, Any] | None) -> None:
    """400 for a tool_choice this server would ignore: it parses tool calls from what the model
    writes ("auto"), and cannot force one."""
    if choice in (None, "none", "auto"):
        return
    if choice == "required" or isinstance(choice, dict):
        raise APIError(
            400, f"tool_choice={json.dumps(choice)} is not supported by the vfkit embedded server: "
            "it cannot force a tool call (vLLM can); send \"auto\" or \"none\", or serve with "
            "vLLM (backend = \"vllm\").", param="tool_choice",
        )
    raise APIError(
        400, f"tool_choice must be \"none\", \"auto\", \"required\" or a function, not "
        f"{json.dumps(choice)}.", param="tool_choice",
    )


def sampling_params(
    req: ChatRequest | CompletionRequest, prompt_len: int, max_model_len: int,
    *, prompt_field: str | None = None,
) -> SamplingParams:
    """Defaults as vLLM's (temperature 1, no truncation); 400 if the prompt cannot fit.
    `prompt_field`: the request field the prompt came from (default: messages / prompt)."""
    wanted = req.requested_max_tokens()
    room = max_model_len - prompt_len
    if room <= 0 or (wanted is not None and wanted > room):
        field = prompt_field or ("messages" if isinstance(req, ChatRequest) else "prompt")
        raise context_length_error(max_model_len, prompt_len, wanted or 1, param=field)
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
        if not isinstance(message["role"], str) or not message["role"]:
            raise APIError(
                400, f"messages[{i}].role must be a string such as \"user\", not "
                f"{json.dumps(message['role'])}.", param=f"messages[{i}].role",
            )
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
        if message.get("tool_calls"):
            message["tool_calls"] = _tool_calls(i, message["tool_calls"])
        out.append(message)
    return out


def _tool_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    """Message `i`'s tool calls, each's string arguments parsed (else the template prints the
    JSON text); 400 naming the call unless each is {"function": {"name": str, ...}, ...}."""
    if not isinstance(calls, list):
        raise APIError(400, f"messages[{i}].tool_calls must be a list.",
                       param=f"messages[{i}].tool_calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            field = f"messages[{i}].tool_calls[{j}]"
            raise APIError(
                400, f'{field} must be {{"type": "function", "function": {{"name": ..., '
                '"arguments": ...}}.', param=field,
            )
        call = json.loads(json.dumps(call))
        fn = call["function"]
        if isinstance(fn.get("arguments"), str):
            with contextlib.suppress(json.JSONDecodeError):
                fn["arguments"] = json.loads(fn["arguments"])
        out.append(call)
    return out


def _content_parts(i: int, content: list[Any], images: ImageParts) -> list[dict[str, Any]]:
    """Text and image parts of message `i`; 400 naming any other part (audio, files: this
    server would otherwise answer as if they were not there)."""
    from vfkit.images import IMAGE_PART_TYPES, part_url

    parts = []
    for j, part in enumerate(content):
        field = f"messages[{i}].content[{j}]"
        kind = part.get("type", "text") if isinstance(part, dict) else None
        if kind not in ("text", *IMAGE_PART_TYPES):
            what = f"type {json.dumps(kind)} is" if kind is not None else "is not an object, and"
            raise APIError(
                400, f'{field} {what} not supported; send {{"type": "text", "text": ...}} or '
                "image parts.", param=field,
            )
        if kind == "text":
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
