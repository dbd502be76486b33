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


def context_length_error(max_len: int, prompt_len: int, max_tokens: int) -> APIError:
    """vLLM's wording: clients (ours included) match "maximum context length is N tokens"."""
    return APIError(
        400,
        f"This model's maximum context length is {max_len} tokens. However, you requested "
        f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the "
        "completion). Please reduce the length of the messages or completion.",
        param="messages",
        code="context_length_exceeded",
    )
