"""Limits on what a request may carry: body size, and sampling fields this server cannot honour.

The body limit is an ASGI middleware so that an oversized body is refused (413) from its
Content-Length before it is read, or as soon as a streamed body passes the limit, instead of
being buffered and parsed (a 20 MB body once held /health for 21 s).
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vfkit.serve.errors import APIError

DEFAULT_MAX_REQUEST_BYTES = 10 * 2**20


class BodyLimit:
    """Answer 413 to any request whose body is larger than `max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            error = self._error(int(declared))
            await JSONResponse(error.body(), status_code=413)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # the route's body read turns this into the answer
                raise HTTPException(413, self._error(received).message)
            return message

        await self.app(scope, limited, send)

    def _error(self, size: int) -> APIError:
        return APIError(
            413,
            f"The request body ({size} bytes or more) is larger than this server accepts "
            f"({self.max_bytes} bytes); send less, or restart vf-serve with a larger "
            "--max-request-bytes.",
        )


# vLLM sampling/request fields with no implementation here, and their neutral values: a request
# that sets one to anything else is refused by name rather than silently served without it.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "min_tokens": (None, 0),
    "prompt_logprobs": (None,),
    "include_stop_str_in_output": (None, False),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "logits_processors": (None, []),
    "truncate_prompt_tokens": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "response_format": (None, {"type": "text"}),
    "suffix": (None, ""),
}


def refuse_unsupported(fields: dict[str, Any]) -> None:
    """400 naming the first field set to something this server would silently ignore."""
    for name, value in fields.items():
        neutral = UNSUPPORTED_FIELDS.get(name)
        if neutral is not None and value not in neutral:
            raise APIError(
                400,
                f"'{name}' is not supported by the vfkit embedded server (vLLM supports it); "
                "leave it out or serve with vLLM (backend = \"vllm\").",
                param=name,
            )
