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
- Generated ids are the reply's tokens (eos appended when it "stopped"), each with logprob
  `logprob`; `max_tokens` cuts them (finish_reason "length"); `stop` strings end the text early.
- Context: a prompt of >= `max_context` tokens, or prompt + max_tokens > `max_context`, gets
  vLLM's 400 "This model's maximum context length is N tokens ...".
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
import contextvars
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import uvicorn
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vfkit.serve.app import create_app
from vfkit.serve.config import ServeConfig
from vfkit.serve.errors import APIError
from vfkit.serve.lora import AdapterFiles, check_load_request
from vfkit.serve.sequence import Sequence

_GENERATION = {"/v1/chat/completions", "/v1/completions"}
_LORA = {"/v1/load_lora_adapter": "load", "/v1/unload_lora_adapter": "unload"}
_BODY: contextvars.ContextVar[Any] = contextvars.ContextVar("scripted_request_body")


class ScriptExhausted(Exception):
    """A scripted TestServer got more requests than it has replies (answered with a 400)."""


@dataclass
class Reply:
    """One scripted answer: text and/or tool calls ({"name", "arguments": dict | str})."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str = "stop"

    def text(self) -> str:
        """The generated text: content, then one Hermes block per tool call."""
        blocks = [
            "<tool_call>"
            + json.dumps({"name": c["name"], "arguments": c.get("arguments", {})})
            + "</tool_call>"
            for c in self.tool_calls or []
        ]
        return (self.content or "") + "".join(blocks)


Responder = Callable[[dict[str, Any]], "str | Reply"] | list | str | None


@lru_cache(maxsize=1)
def _default_tokenizer():
    from vfkit.testing.tiny_model import make_tokenizer

    return make_tokenizer()


class ScriptedLora:
    """The LoRA side of the scripted engine: vLLM's name rules, no weights applied."""

    def __init__(self) -> None:
        self._paths: dict[str, Path] = {}
        self._fingerprints: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self.path_counts: Counter[str] = Counter()

    def has(self, name: str) -> bool:
        return True  # any model name is served by the script

    def paths(self) -> dict[str, Path]:
        with self._lock:
            return dict(self._paths)

    def fingerprints(self) -> dict[str, str | None]:
        with self._lock:
            return dict(self._fingerprints)

    def check_load(self, name: str, path: str, inplace: bool) -> AdapterFiles:
        with self._lock:
            loaded = name in self._paths
        check_load_request(name, path, loaded=loaded, inplace=inplace)
        folder = Path(path).expanduser().resolve()
        if not folder.exists():
            raise APIError(404, f"No adapter found at {path}", param="lora_path")
        from vfkit.lora_fingerprint import ADAPTER_WEIGHTS, fingerprint_dir  # imports torch

        print_ = fingerprint_dir(folder) if (folder / ADAPTER_WEIGHTS).is_file() else None
        return AdapterFiles(folder, config={}, peft_config=None, weights={}, fingerprint=print_)

    def apply_load(self, name: str, files: AdapterFiles) -> None:
        with self._lock:
            self._paths[name], self._fingerprints[name] = files.path, files.fingerprint

    def begin_unload(self, name: str) -> None:
        with self._lock:
            if self._paths.pop(name, None) is None:
                raise APIError(
                    404, f"The lora adapter '{name}' cannot be found.", param="lora_name"
                )
            self._fingerprints.pop(name, None)

    def apply_unload(self, name: str) -> None:
        pass


class ScriptedEngine:
    """The `Engine` interface the app uses, answering each sequence from the responder."""

    def __init__(
        self, responder: Responder, tokenizer: Any, max_context: int, logprob: float, model: str
    ) -> None:
        self.responder = responder
        self.tokenizer = tokenizer
        self.max_model_len = max_context
        self.logprob = logprob
        self.model_path = model
        self.lora = ScriptedLora()
        self.stats = _NoStats()
        self.alive = True
        self._script_pos = 0
        self._lock = threading.Lock()

    def load(self) -> dict[str, int]:
        return {"waiting": 0, "running": 0}

    def generator(self, seed: int | None, index: int) -> None:
        return None  # the script decides the text; seeds change nothing

    def call(self, fn: Callable[[], Any], *, unused_adapter: str | None = None) -> Future:
        future: Future = Future()
        future.set_result(fn())
        return future

    def stop(self) -> None:
        self.alive = False

    def submit(self, seqs: list[Sequence]) -> None:
        """Generate every sequence at once from the responder's replies."""
        body = _BODY.get(None) or {}
        try:
            replies = [self._next_reply(body) for _ in seqs]
        except ScriptExhausted as exc:
            raise APIError(400, str(exc)) from exc
        except Exception as exc:  # a broken responder surfaces as a 500 naming it
            raise APIError(500, f"TestServer responder raised {type(exc).__name__}: {exc}") from exc
        for seq, reply in zip(seqs, replies, strict=True):
            self._play(seq, reply if isinstance(reply, Reply) else Reply(content=reply))

    def _next_reply(self, body: dict[str, Any]) -> str | Reply:
        responder = self.responder
        if responder is None:
            last = body["messages"][-1] if "messages" in body else {"content": body.get("prompt")}
            return str(_text_of(last.get("content")) or "")
        if isinstance(responder, str):
            return responder
        if isinstance(responder, list):
            with self._lock:
                pos, self._script_pos = self._script_pos, self._script_pos + 1
            if pos >= len(responder):
                raise ScriptExhausted(f"TestServer script exhausted after {len(responder)} replies")
            return responder[pos]
        return responder(body)

    def _play(self, seq: Sequence, reply: Reply) -> None:
        """Tokens, text and finish reason of the reply, delivered as the engine would."""
        text, finish = reply.text(), reply.finish_reason
        hits = [(text.index(s), s) for s in seq.params.stop if s in text]
        ids_text, eos = text, finish == "stop"
        if hits:
            cut, stop = min(hits)
            text, ids_text, eos, finish = text[:cut], text[: cut + len(stop)], False, "stop"
        ids = self.tokenizer.encode(ids_text, add_special_tokens=False)
        if eos:
            ids.append(self.tokenizer.eos_token_id)
        if len(ids) > seq.params.max_tokens:
            ids = ids[: seq.params.max_tokens]
            text, finish = self.tokenizer.decode(ids, skip_special_tokens=True), "length"
        want = seq.params.logprobs
        for i, token in enumerate(ids):
            top = [(token, self.logprob)] if want else []
            seq.output_ids.append(token)
            if want is not None:
                seq.logprobs.append(self.logprob)
                seq.top_logprobs.append(top)
            if i == len(ids) - 1:
                seq.text, seq.finish_reason = text, finish
            if seq.on_token is not None:
                seq.on_token(seq, token, self.logprob if want is not None else None, top)
        if not ids:
            seq.text, seq.finish_reason = text, finish
        if seq.on_done is not None:
            seq.on_done(seq)


@dataclass
class _NoStats:
    """GET /stats of a scripted engine: no model, no counters."""

    scripted: bool = True


def _text_of(content: Any) -> Any:
    """Flatten OpenAI content parts to text."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


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
        if path in _LORA:
            self.server.lora_requests.append((_LORA[path], body))
        else:
            failure = await self.server._on_generation_request(body)
            if failure is not None:
                await failure(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        token = _BODY.set(body if isinstance(body, dict) else None)
        try:
            await self.app(scope, replay, send)
        finally:
            _BODY.reset(token)


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
        self.tokenizer = tokenizer if tokenizer is not None else _default_tokenizer()
        self.max_context = max_context
        self.logprob = logprob
        self.model = model
        self.api_key = api_key
        self.engine = ScriptedEngine(responder, self.tokenizer, max_context, logprob, model)
        self.requests: list[dict[str, Any]] = []
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

    def delay_next(self, seconds: float, n: int = 1) -> None:
        """Hold the next `n` generation requests for `seconds` before answering."""
        with self._lock:
            self._delays.extend([seconds] * n)

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
