"""The real `vfkit.serve` app over a scripted engine, on loopback: a vLLM-protocol test double.

Tests of the rollout engine, trainer and CLIs talk real HTTP to it with the real `openai` client:

    from openai import AsyncOpenAI
    from vfkit.testing.scripted_server import Reply, TestServer

    script = ["first reply", Reply(tool_calls=[{"name": "add", "arguments": {"a": 1}}])]
    with TestServer(script) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="x")
        ...                      # srv.requests holds every generation request body received
        # srv.client(max_retries=0) is a shortcut for the AsyncOpenAI above

Only the text is scripted: request validation, prompt rendering, response shapes, tool-call
parsing, streaming, LoRA routes, auth and errors are those of `vfkit.serve.app`, so the protocol
exists once and a test passing here passes against `vf-serve`.

- `responder` decides each answer: a callable `(request_body: dict) -> str | Reply`; a list (a
  script, replies in order; a request past its end gets a 400 "script exhausted"); a str (always
  that); None (echo the last message's text). A str is the raw generated text: when the request
  has `tools`, `<tool_call>{"name": .., "arguments": {..}}</tool_call>` blocks in it come back as
  OpenAI `tool_calls` (the server's Hermes parser). `Reply(tool_calls=[{"name", "arguments":
  dict | str}])` generates such blocks; a str `arguments` comes back verbatim (it may be
  malformed JSON on purpose). A responder that raises gets a 500 naming the exception.
- Prompts are rendered with the tokenizer's chat template (tools included) and tokenized; by
  default the tiny byte tokenizer of `vfkit.testing.tiny_model` (a token per byte, eos <|im_end|>).
- vLLM's token-in route `/inference/v1/generate` (prime-rl's train client) is served too; its
  responder sees the request body with `prompt` = the decoded `token_ids`.
- Generated ids are the reply's tokens (eos appended when it "stopped"), each with logprob
  `logprob`; `max_tokens` cuts them (finish_reason "length"); `stop` strings end the text early.
- Context: a prompt of >= `max_context` tokens, or prompt + max_tokens > `max_context`, gets
  vLLM's 400 "This model's maximum context length is N tokens ...".
- `max_in_flight`: the most generation requests it was answering at once (client concurrency).
- Faults: `fail_next(status, n=1, retry_after=None)` answers the next n generation requests with
  that status (Retry-After header when given, in seconds, floats allowed);
  `delay_next(seconds, n=1)` holds the next n generation requests that long (client timeouts).
- LoRA: the server's load/unload routes; any existing folder loads (an adapter_model.safetensors
  in it gives the model card its `fingerprint`, else None); reload without load_inplace -> 400;
  missing folder -> 404; unknown unload -> 404. `.adapters` maps name -> resolved path,
  `.lora_requests` records ("load"|"unload", body). Any `model` name is served (the recorded
  request body shows which one was asked for).
- `api_key`: when set, every route (/health too, as on vf-serve) needs `Bearer <key>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vfkit.serve.app import create_app
from vfkit.serve.config import ServeConfig
from vfkit.serve.errors import APIError
from vfkit.testing.scripted_engine import (
    REQUEST_BODY,
    Reply,
    Responder,
    ScriptedEngine,
    ScriptExhausted,
    default_tokenizer,
)

__all__ = ["Reply", "Responder", "ScriptExhausted", "TestServer"]

_TOKEN_ROUTE = "/inference/v1/generate"
_GENERATION = {"/v1/chat/completions", "/v1/completions", _TOKEN_ROUTE}
_LORA = {"/v1/load_lora_adapter": "load", "/v1/unload_lora_adapter": "unload"}


class _Recorder:
    """Innermost middleware: records bodies, plays injected faults, hands the body to the engine."""

    def __init__(self, app: ASGIApp, server: TestServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or (path not in _GENERATION and path not in _LORA):
            await self.app(scope, receive, send)
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if path == _TOKEN_ROUTE and isinstance(body, dict):
            body = {**body, "prompt": self.server.decode_prompt(body.get("token_ids"))}
        if path in _LORA:
            self.server.lora_requests.append((_LORA[path], body))
            await self._serve(scope, receive, send, raw, body)
            return
        with self.server._counting_in_flight():
            failure = await self.server._on_generation_request(body)
            if failure is not None:
                await failure(scope, receive, send)
                return
            await self._serve(scope, receive, send, raw, body)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, raw: bytes,
                     body: Any) -> None:
        """The app, given the body already read."""
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        token = REQUEST_BODY.set(body if isinstance(body, dict) else None)
        try:
            await self.app(scope, replay, send)
        finally:
            REQUEST_BODY.reset(token)


class TestServer:
    """The serve app over a scripted engine on 127.0.0.1:<free port> (see module doc)."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        responder: Responder = None,
        *,
        tokenizer: Any = None,
        max_context: int = 4096,
        logprob: float = -0.5,
        model: str = "test-model",
        api_key: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer if tokenizer is not None else default_tokenizer()
        self.max_context = max_context
        self.logprob = logprob
        self.model = model
        self.api_key = api_key
        self.engine = ScriptedEngine(responder, self.tokenizer, max_context, logprob, model)
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0  # generation requests being answered
        self.lora_requests: list[tuple[str, dict[str, Any]]] = []
        self._failures: list[tuple[int, float | None, str | None]] = []
        self._delays: list[float] = []
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        config = ServeConfig(model, api_key=api_key, max_model_len=max_context)
        self.app = create_app(self.engine, config)
        self.app.user_middleware.append(Middleware(_Recorder, server=self))  # innermost

    @property
    def responder(self) -> Responder:
        return self.engine.responder

    @responder.setter
    def responder(self, value: Responder) -> None:
        self.engine.responder = value

    @property
    def adapters(self) -> dict[str, str]:
        """Loaded adapter names -> resolved folder."""
        return {name: str(path) for name, path in self.engine.lora.paths().items()}

    # ----- lifecycle -----
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, **kwargs: Any) -> Any:
        """An openai.AsyncOpenAI for this server (kwargs: timeout, max_retries, ...)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key or "test", **kwargs)

    def start(self) -> TestServer:
        """Bind a free loopback port, serve in a daemon thread; return once it accepts requests."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True, name=f"TestServer:{self.port}")  # fmt: skip
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"TestServer did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=5)

    def __enter__(self) -> TestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----- fault injection -----
    def fail_next(self, status: int, n: int = 1, retry_after: float | None = None,
                  message: str | None = None) -> None:  # fmt: skip
        """Answer the next `n` generation requests with HTTP `status` (and Retry-After if given)."""
        with self._lock:
            self._failures.extend([(status, retry_after, message)] * n)

    def decode_prompt(self, token_ids: Any) -> str | None:
        """The text of a token-route prompt, which responders see as the body's `prompt`."""
        try:
            return self.tokenizer.decode(token_ids)
        except (TypeError, ValueError, OverflowError):
            return None  # not token ids: the route itself refuses the request

    def delay_next(self, seconds: float, n: int = 1) -> None:
        """Hold the next `n` generation requests for `seconds` before answering."""
        with self._lock:
            self._delays.extend([seconds] * n)

    @contextlib.contextmanager
    def _counting_in_flight(self) -> Iterator[None]:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _on_generation_request(self, body: Any) -> JSONResponse | None:
        """Record the body; wait out an injected delay; the injected failure's answer, if any."""
        with self._lock:
            self.requests.append(body)
            delay = self._delays.pop(0) if self._delays else 0.0
            failure = self._failures.pop(0) if self._failures else None
        if delay:
            await asyncio.sleep(delay)
        if failure is None:
            return None
        status, retry_after, message = failure
        error = APIError(status, message or f"injected failure {status}")
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return JSONResponse(error.body(), status_code=status, headers=headers)
