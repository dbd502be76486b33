"""vLLM's token-in, token-out route, `POST /inference/v1/generate`.

prime-rl's train client (the `renderers` generate client) renders chat messages itself and
sends token ids; the server samples and answers with token ids and their logprobs, as
`{"token": "token_id:<id>", "logprob": ...}` entries, with no chat template and no text on the
way. The request:

    {"model": "name or adapter", "token_ids": [...], "stream": false,
     "sampling_params": {"max_tokens": 32, "temperature": 0.7, "logprobs": 1, "seed": 3, ...}}

`sampling_params` takes the fields `/v1/completions` takes, with the same defaults and limits
(one validation, `protocol.CompletionRequest`); fields this server cannot honour are refused by
name. `cache_salt`, `priority` and `request_id` are accepted and have no effect here. Image
inputs (`features`, `content_parts`) and streaming are refused: this route is text-only here.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from vfkit.serve.errors import APIError
from vfkit.serve.limits import refuse_unsupported
from vfkit.serve.protocol import CompletionRequest, RequestBody
from vfkit.serve.responses import TokenText, chat_logprob_entries, usage
from vfkit.serve.sequence import Sequence

# Keys of the request itself: inside sampling_params they are a client's mistake.
_REQUEST_KEYS = ("prompt", "model", "stream", "echo", "token_ids")


class GenerateRequest(RequestBody):
    """POST /inference/v1/generate."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    token_ids: list[int] = Field(min_length=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False


def sampling_request(req: GenerateRequest) -> CompletionRequest:
    """The request's sampling params as a token-prompt completions request; 400 naming
    `sampling_params.<field>` for a bad value, or the request field this route refuses."""
    if req.stream:
        raise APIError(400, "stream=true is not served on /inference/v1/generate by vf-serve; "
                            "send stream=false (or stream from /v1/completions).", param="stream")
    for name in ("features", "content_parts"):
        if (req.model_extra or {}).get(name):
            raise APIError(400, f"'{name}' (image inputs) is not served on the token route by "
                                "vf-serve; send images to /v1/chat/completions.", param=name)
    for key in _REQUEST_KEYS:
        if key in req.sampling_params:
            raise APIError(400, f"sampling_params.{key} is not a sampling parameter; set it "
                                "on the request itself.", param=f"sampling_params.{key}")
    try:
        out = CompletionRequest(prompt=req.token_ids, model=req.model, **req.sampling_params)
    except ValidationError as exc:
        problems = "; ".join(
            f"sampling_params.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
        )
        raise APIError(400, f"Invalid request: {problems}", param="sampling_params") from exc
    refuse_unsupported(out.model_extra or {})
    return out


def generate_response(
    prompt_ids: list[int], seqs: list[Sequence], tokens: TokenText
) -> dict[str, Any]:
    """The answer: one choice per sample, token ids and (when asked) their logprobs by id."""
    choices = [
        {
            "index": index,
            "token_ids": seq.output_ids,
            "finish_reason": seq.finish_reason,
            "logprobs": None if seq.params.logprobs is None else {"content": chat_logprob_entries(
                seq.output_ids, seq.logprobs, seq.top_logprobs, tokens, as_ids=True)},
        }
        for index, seq in enumerate(seqs)
    ]
    return {
        "request_id": f"generate-{uuid.uuid4().hex}",
        "choices": choices,
        "prompt_token_ids": prompt_ids,
        "usage": usage(len(prompt_ids), seqs),
    }
