"""The scripted engine behind `TestServer`: the `Engine` interface of `vfkit.serve`, with replies
decided by a responder instead of a model (see `vfkit.testing.scripted_server`).

The request body reaches the engine through `REQUEST_BODY`, set by the server's recording
middleware for the request being handled (responders receive it).
"""

from __future__ import annotations

import contextvars
import json
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from vfkit.serve.errors import APIError
from vfkit.serve.lora import ServedAdapters
from vfkit.serve.lora_files import AdapterFiles, check_load_request
from vfkit.serve.sequence import Sequence

REQUEST_BODY: contextvars.ContextVar[Any] = contextvars.ContextVar("scripted_request_body")


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
def default_tokenizer():
    from vfkit.testing.tiny_model import make_tokenizer

    return make_tokenizer()


class ScriptedLora(ServedAdapters):
    """The LoRA side of the scripted engine: the server's name rules, no weights applied."""

    def __init__(self) -> None:
        super().__init__()
        self.path_counts: Counter[str] = Counter()

    def has(self, name: str) -> bool:
        return True  # any model name is served by the script

    def check_load(self, name: str, path: str, inplace: bool) -> AdapterFiles:
        check_load_request(name, path, loaded=name in self.paths(), inplace=inplace)
        folder = Path(path).expanduser().resolve()
        if not folder.exists():
            raise APIError(404, f"No adapter found at {path}", param="lora_path")
        from vfkit.lora_fingerprint import ADAPTER_WEIGHTS, fingerprint_dir  # imports torch

        print_ = fingerprint_dir(folder) if (folder / ADAPTER_WEIGHTS).is_file() else None
        return AdapterFiles(folder, config={}, peft_config=None, weights={}, fingerprint=print_)

    def apply_load(self, name: str, files: AdapterFiles) -> None:
        self._serve(name, files)

    def apply_unload(self, name: str) -> None:
        pass


class ScriptedEngine:
    """The `Engine` interface the app uses, answering each sequence from the responder."""

    image_parts = "drop"  # no model to show images to: prompts keep their text (no 400)

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
        """As the engine's worker does: the outcome, or the error, lands on the future."""
        future: Future = Future()
        try:
            future.set_result(fn())
        except Exception as exc:
            future.set_exception(exc)
        return future

    def stop(self) -> None:
        self.alive = False

    def submit(self, seqs: list[Sequence]) -> None:
        """Generate every sequence at once from the responder's replies."""
        body = REQUEST_BODY.get(None) or {}
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
