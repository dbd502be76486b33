"""HTTP errors with OpenAI-style bodies: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error answered to the client; `status` is the HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients parse into their exception's message."""
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def context_length_error(
    max_len: int, prompt_len: int, max_tokens: int, *, param: str = "messages"
) -> APIError:
    """vLLM's wording: clients (ours included) match "maximum context length is N tokens"."""
    return APIError(
        400,
        f"This model's maximum context length is {max_len} tokens. However, you requested "
        f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the "
        "completion). Please reduce the length of the messages or completion.",
        param=param,
        code="context_length_exceeded",
    )


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """A pydantic error location as the request field: ('body', 'messages', 0, 'role') ->
    'messages[0].role' ('' for the body itself)."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """400 for a body the request schema refused, naming the first field (as `param` too);
    an unparsable body or one that is not a JSON object says what to send instead."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        at = first.get("loc", ("body", "?"))[-1]
        reason = first.get("ctx", {}).get("error", "JSON decode error")
        return APIError(
            400, f"The request body is not valid JSON ({reason} at character {at}); send a JSON "
            "object with Content-Type: application/json.",
        )
    field = field_path(first.get("loc", ()))
    if not field and first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        return APIError(
            400, "The request body must be a JSON object; send one with Content-Type: "
            "application/json.",
        )
    problems = [f"{field_path(e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in errors]
    return APIError(400, "Invalid request: " + "; ".join(problems), param=field or None)
