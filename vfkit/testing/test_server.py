"""A scripted OpenAI-compatible server on loopback that answers the way vLLM does.

Tests of the rollout engine, trainer and CLIs talk real HTTP to it with the real `openai` client:

    from openai import AsyncOpenAI
    from vfkit.testing.test_server import Reply, TestServer

    script = ["first reply", Reply(tool_calls=[{"name": "add", "arguments": {"a": 1}}])]
    with TestServer(script) as srv:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="x")
        ...                      # srv.requests holds every generation request body received
        # srv.client(max_retries=0) is a shortcut for the AsyncOpenAI above

- `responder` decides each answer: a callable `(request_body: dict) -> str | Reply`; a list (a
  script, replies in order; a request past its end gets a 400 "script exhausted"); a str (always
  that); None (echo the last message's text). A str is the raw generated text: when the request
  has `tools`, `<tool_call>{"name": .., "arguments": {..}}</tool_call>` blocks in it come back as
  OpenAI `tool_calls` (Hermes style, like vLLM's parser). `Reply(tool_calls=[{"name", "arguments":
  dict | str}])` returns those calls verbatim (a str `arguments` may be malformed JSON on purpose).
  A responder that raises gets a 500 naming the exception.
- Prompts are rendered with the tokenizer's chat template (tools included) and tokenized; by
  default the tiny byte tokenizer of `vfkit.testing.tiny_model` (a token per byte, eos <|im_end|>).
- Responses carry `prompt_token_ids`, `choices[i].token_ids` (eos appended when generation
  "stopped") and `logprob` for every sampled token, when asked (`logprobs`, `return_token_ids`).
- `max_tokens` cuts the ids (finish_reason "length"); `stop` strings end the text early.
- Context: a prompt of >= `max_context` tokens, or prompt + max_tokens > `max_context`, gets
  vLLM's 400 "This model's maximum context length is N tokens ...".
- Faults: `fail_next(status, n=1, retry_after=None)` answers the next n generation requests with
  that status (Retry-After header when given, in seconds, floats allowed);
  `delay_next(seconds, n=1)` holds the next n generation requests that long (client timeouts).
- LoRA: POST /v1/load_lora_adapter and /v1/unload_lora_adapter behave like vLLM's (the path must
  exist; reload without load_inplace -> 400; unknown unload -> 404). `.adapters` maps name ->
  path, `.lora_requests` records ("load"|"unload", body); GET /v1/models lists base + adapters.
  Any `model` name is accepted; the recorded request body shows which one was asked for.
- `api_key`: when set, requests without `Authorization: Bearer <key>` get 401.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from vfkit.lora_fingerprint import ADAPTER_WEIGHTS, fingerprint_dir

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ScriptExhausted(Exception):
    """A scripted TestServer got more requests than it has replies (answered with a 400)."""


@dataclass
class Reply:
    """One scripted answer: text and/or tool calls ({"name", "arguments": dict | str})."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str = "stop"


Responder = Callable[[dict[str, Any]], "str | Reply"] | list | str | None


@lru_cache(maxsize=1)
def _default_tokenizer():
    from vfkit.testing.tiny_model import make_tokenizer

    return make_tokenizer()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
            429: "RateLimitError"}.get(status, "InternalServerError")
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


def _text_of(content: Any) -> str:
    """Flatten OpenAI content parts to text (the template only takes strings)."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


def _call_text(name: str, arguments: Any) -> str:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def _parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split Hermes <tool_call> blocks out of generated text; unparsable blocks stay in the text."""
    calls = []
    for block in TOOL_CALL_RE.findall(text):
        try:
            obj = json.loads(block)
            calls.append({"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))})
        except (ValueError, KeyError, TypeError):
            return text, []
    if not calls:
        return text, []
    content = text[: text.index("<tool_call>")]
    return (content if content.strip() else None), calls


class TestServer:
    """OpenAI-compatible server in a background thread on 127.0.0.1:<free port> (see module doc)."""

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
        self.responder = responder
        self.tokenizer = tokenizer if tokenizer is not None else _default_tokenizer()
        self.max_context = max_context
        self.logprob = logprob
        self.model = model
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.adapters: dict[str, str] = {}
        self.fingerprints: dict[str, str | None] = {}
        self.lora_requests: list[tuple[str, dict[str, Any]]] = []
        self._script_pos = 0
        self._failures: list[tuple[int, float | None, str | None]] = []
        self._delays: list[float] = []
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.app = self._build_app()

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
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True, name=f"TestServer:{self.port}")
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
                  message: str | None = None) -> None:
        """Answer the next `n` generation requests with HTTP `status` (and Retry-After if given)."""
        with self._lock:
            self._failures.extend([(status, retry_after, message)] * n)

    def delay_next(self, seconds: float, n: int = 1) -> None:
        """Hold the next `n` generation requests for `seconds` before answering."""
        with self._lock:
            self._delays.extend([seconds] * n)

    # ----- generation -----
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

    def _render_prompt(self, body: dict[str, Any]) -> list[int]:
        if "messages" not in body:
            prompt = body.get("prompt", "")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, list):  # already token ids
                return [int(t) for t in prompt]
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        messages = [{**m, "content": _text_of(m.get("content"))} for m in body["messages"]]
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=body.get("tools"),
            tokenize=False,
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False),
            **(body.get("chat_template_kwargs") or {}),
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _sample(self, body: dict[str, Any], limit: int) -> dict[str, Any]:
        """One choice: generated text, its token ids, finish reason and tool calls."""
        reply = self._next_reply(body)
        if isinstance(reply, str):
            reply = Reply(content=reply)
        text = (reply.content or "") + "".join(
            _call_text(c["name"], c.get("arguments", {})) for c in reply.tool_calls or []
        )
        finish = reply.finish_reason
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        hits = [(text.index(s), s) for s in stops if s and s in text]
        ids_text, eos = text, finish == "stop"
        if hits:
            cut, stop_str = min(hits)
            text, ids_text, eos, finish = text[:cut], text[: cut + len(stop_str)], False, "stop"
        ids = self.tokenizer.encode(ids_text, add_special_tokens=False)
        if eos:
            ids.append(self.tokenizer.eos_token_id)
        cut_short = len(ids) > limit
        if cut_short:
            ids = ids[:limit]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            finish = "length"
        if reply.tool_calls and not cut_short and not hits:
            content = reply.content
            calls = [{"name": c["name"], "arguments": c.get("arguments", {})}
                     for c in reply.tool_calls]
            calls = [{**c, "arguments": c["arguments"] if isinstance(c["arguments"], str)
                      else json.dumps(c["arguments"])} for c in calls]
        elif body.get("tools") and "messages" in body:
            content, calls = _parse_tool_calls(text)
        else:
            content, calls = text, []
        if calls and finish == "stop":
            finish = "tool_calls"
        return {"text": text, "content": content, "ids": ids, "finish": finish, "calls": calls}

    def _token_logprobs(self, ids: list[int], top: int) -> list[dict[str, Any]]:
        out = []
        for tid in ids:
            tok = self.tokenizer.decode([tid])
            entry = {"token": tok, "logprob": self.logprob, "bytes": list(tok.encode())}
            out.append({**entry, "top_logprobs": [entry] if top else []})
        return out

    def _context_error(self, n_prompt: int, max_tokens: int | None) -> JSONResponse | None:
        ctx = self.max_context
        if n_prompt >= ctx:
            return _error(400, f"This model's maximum context length is {ctx} tokens. However, "
                               f"your request has {n_prompt} input tokens. Please reduce the "
                               "length of the input messages.")
        if max_tokens is not None and n_prompt + max_tokens > ctx:
            return _error(400, f"'max_tokens' or 'max_completion_tokens' is too large: "
                               f"{max_tokens}. This model's maximum context length is {ctx} tokens "
                               f"and your request has {n_prompt} input tokens "
                               f"({max_tokens} > {ctx} - {n_prompt}).")
        return None

    async def _generate(self, request: Request, chat: bool) -> JSONResponse:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            delay = self._delays.pop(0) if self._delays else 0.0
            failure = self._failures.pop(0) if self._failures else None
        if delay:
            await asyncio.sleep(delay)
        if failure is not None:
            status, retry_after, message = failure
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
            return _error(status, message or f"injected failure {status}", headers)
        try:
            prompt_ids = self._render_prompt(body)
        except Exception as e:  # a template that rejects the messages is the client's fault
            return _error(400, f"could not render the prompt: {e}")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        overflow = self._context_error(len(prompt_ids), max_tokens)
        if overflow is not None:
            return overflow
        limit = max_tokens if max_tokens is not None else self.max_context - len(prompt_ids)
        try:
            samples = [self._sample(body, limit) for _ in range(body.get("n") or 1)]
        except ScriptExhausted as e:
            return _error(400, str(e))
        except Exception as e:  # a broken responder surfaces as a 500 naming it
            return _error(500, f"TestServer responder raised {type(e).__name__}: {e}")
        want_ids = bool(body.get("return_token_ids"))
        choices = [(self._chat_choice if chat else self._text_choice)(body, i, s, prompt_ids)
                   for i, s in enumerate(samples)]
        if not want_ids:
            for c in choices:
                c.pop("token_ids", None)
                c.pop("prompt_token_ids", None)
        n_out = sum(len(s["ids"]) for s in samples)
        resp = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{len(self.requests)}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out,
                      "total_tokens": len(prompt_ids) + n_out},
        }
        if chat and want_ids:
            resp["prompt_token_ids"] = prompt_ids
        return JSONResponse(resp)

    def _chat_choice(self, body: dict, index: int, s: dict, prompt_ids: list[int]) -> dict:
        calls = [{"id": f"call_{len(self.requests)}_{index}_{k}", "type": "function",
                  "function": c} for k, c in enumerate(s["calls"])]
        logprobs = None
        if body.get("logprobs"):
            logprobs = {"content": self._token_logprobs(s["ids"], body.get("top_logprobs") or 0)}
        message = {"role": "assistant", "content": s["content"], "tool_calls": calls or None}
        return {"index": index, "message": message, "finish_reason": s["finish"],
                "logprobs": logprobs, "token_ids": s["ids"]}

    def _text_choice(self, body: dict, index: int, s: dict, prompt_ids: list[int]) -> dict:
        logprobs = None
        if body.get("logprobs") is not None:
            entries = self._token_logprobs(s["ids"], body["logprobs"])
            offsets, pos = [], 0
            for e in entries:
                offsets.append(pos)
                pos += len(e["token"])
            logprobs = {"tokens": [e["token"] for e in entries],
                        "token_logprobs": [e["logprob"] for e in entries],
                        "top_logprobs": [{e["token"]: e["logprob"]} for e in entries],
                        "text_offset": offsets}
        return {"index": index, "text": s["text"], "finish_reason": s["finish"],
                "logprobs": logprobs, "prompt_token_ids": prompt_ids, "token_ids": s["ids"]}

    # ----- LoRA and app -----
    def _load_lora(self, body: dict[str, Any]) -> PlainTextResponse | JSONResponse:
        name, path = body.get("lora_name"), body.get("lora_path")
        self.lora_requests.append(("load", body))
        if not name or not path:
            return _error(400, "both 'lora_name' and 'lora_path' must be provided")
        if name in self.adapters and not body.get("load_inplace"):
            return _error(400, f"The lora adapter '{name}' has already been loaded. "
                               "Pass load_inplace=true to replace it.")
        if not Path(path).exists():
            return _error(404, f"No adapter found at {path}")
        self.adapters[name] = path
        weights = Path(path) / ADAPTER_WEIGHTS
        self.fingerprints[name] = fingerprint_dir(Path(path)) if weights.is_file() else None
        message = f"Success: LoRA adapter '{name}' added successfully."
        return JSONResponse({"message": message, "lora_name": name,
                             "fingerprint": self.fingerprints[name]})

    def _unload_lora(self, body: dict[str, Any]) -> PlainTextResponse | JSONResponse:
        name = body.get("lora_name")
        self.lora_requests.append(("unload", body))
        if name not in self.adapters:
            return _error(404, f"The lora adapter '{name}' cannot be found.")
        del self.adapters[name]
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    def _models(self) -> dict[str, Any]:
        base = {"id": self.model, "object": "model", "owned_by": "vfkit", "root": self.model,
                "parent": None, "max_model_len": self.max_context}
        loras = [{"id": n, "object": "model", "owned_by": "vfkit", "root": p,
                  "parent": self.model, "fingerprint": self.fingerprints.get(n)}
                 for n, p in self.adapters.items()]
        return {"object": "list", "data": [base, *loras]}

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def check_key(request: Request, call_next):
            auth = request.headers.get("authorization", "")
            if self.api_key and request.url.path != "/health" and auth != f"Bearer {self.api_key}":
                return _error(401, "Invalid or missing API key.")
            return await call_next(request)

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models():
            return self._models()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await self._generate(request, chat=True)

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await self._generate(request, chat=False)

        @app.post("/v1/load_lora_adapter")
        async def load_lora(request: Request):
            return self._load_lora(await request.json())

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora(request: Request):
            return self._unload_lora(await request.json())

        return app
