"""`stream: true`: Server-Sent Events in vLLM's shape for chat and text completions.

Each generated token reaches the event loop through `Sequence.on_token` (called on the engine
thread once the token is recorded, with the finish reason when it was the last). One chunk per
token that adds text or that carries what was asked for (`token_ids` with `return_token_ids`,
`logprobs`); text a stop string may still claim is held back until it is clear. The first chat
chunk of each choice carries `role` (and `prompt_token_ids` when asked), the last one its
`finish_reason`; with `stream_options.include_usage` a usage chunk with no choices comes last,
then `data: [DONE]`. With `tools`, a chat choice's text is held to the end, where Hermes
`<tool_call>` blocks become `tool_calls` deltas (as vLLM's parser, whole calls at once).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import StreamingResponse

from vfkit.serve.errors import APIError
from vfkit.serve.protocol import ChatRequest, CompletionRequest
from vfkit.serve.responses import TokenText, chat_logprob_entries, completion_logprobs
from vfkit.serve.sequence import Sequence, abort_unfinished
from vfkit.serve.tool_calls import parse_tool_calls

_DONE = "data: [DONE]\n\n"


@dataclass
class _Progress:
    """What one sequence has produced and what its client has been sent."""

    index: int
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded so far (incrementally)
    sent: str = ""  # text already sent
    sent_tokens: int = 0  # tokens already sent
    logprobs: list[float] = field(default_factory=list)
    tops: list[Any] = field(default_factory=list)
    offset: int = 0  # text_offset of the next unsent token (completions logprobs)
    prefix: int = 0  # incremental detokenization window [prefix, read) -> text
    read: int = 0
    started: bool = False
    finished: bool = False


class TokenEvents:
    """Engine-thread callbacks that queue (kind, seq, payload) events on the event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[str, Sequence, Any]] = asyncio.Queue()

    def on_token(self, seq: Sequence, token: int, logprob: float | None, top: Any) -> None:
        last = (seq.finish_reason, seq.text) if seq.finish_reason is not None else None
        self.loop.call_soon_threadsafe(
            self.queue.put_nowait, ("token", seq, (token, logprob, top, last))
        )


class Streamer:
    """Turns token events of one request's sequences into SSE chunks."""

    def __init__(
        self,
        req: ChatRequest | CompletionRequest,
        model: str,
        groups: list[list[Sequence]],
        prompts: list[list[int]],
        tokens: TokenText,
        tokenizer: Any,
    ) -> None:
        self.req, self.model, self.tokens, self.tokenizer = req, model, tokens, tokenizer
        self.chat = isinstance(req, ChatRequest)
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.seqs = [s for g in groups for s in g]
        self.prompts = prompts
        self.progress: dict[Sequence, _Progress] = {}
        for prompt, group in zip(prompts, groups, strict=True):
            for seq in group:
                self.progress[seq] = _Progress(len(self.progress), prompt)
        self.hold_text = self.chat and req.parses_tools()
        self.stops = [s for s in ([req.stop] if isinstance(req.stop, str) else req.stop or []) if s]

    async def events(self, queue: asyncio.Queue) -> AsyncIterator[str]:
        """SSE lines until every sequence is finished (or one failed)."""
        remaining = len(self.seqs)
        while remaining:
            kind, seq, payload = await queue.get()
            progress = self.progress[seq]
            if progress.finished:
                continue
            if kind == "done":  # finished without a last token: an error or an abort
                progress.finished = True
                remaining -= 1
                if seq.error is not None:
                    yield _sse(APIError(500, f"Generation failed: {seq.error!r}").body())
                    return
                continue
            token, logprob, top, last = payload
            chunk = self._on_token(seq, progress, token, logprob, top, last)
            if chunk is not None:
                yield _sse(chunk)
            if last is not None:
                progress.finished = True
                remaining -= 1
        options = getattr(self.req, "stream_options", None) or {}
        if options.get("include_usage"):
            yield _sse(self._usage())

    def _on_token(self, seq, progress, token, logprob, top, last) -> dict[str, Any] | None:
        progress.ids.append(token)
        if logprob is not None:
            progress.logprobs.append(logprob)
            progress.tops.append(top)
        if last is not None:
            finish, final_text = last
            return self._final(seq, progress, finish, final_text)
        self._detokenize(seq, progress)
        if self.hold_text:
            return None
        visible = self._without_stop_prefix(progress.text)
        delta = visible[len(progress.sent) :] if visible.startswith(progress.sent) else ""
        carries = self.req.return_token_ids or seq.params.logprobs is not None
        if not delta and not carries:
            return None
        return self._chunk(seq, progress, delta, finish=None)

    def _final(self, seq, progress, finish: str, text: str) -> dict[str, Any]:
        calls: list[dict[str, Any]] = []
        if self.hold_text:
            content, calls = parse_tool_calls(text)
            text = content or ""
        delta = text[len(progress.sent) :] if text.startswith(progress.sent) else ""
        if calls:
            finish = "tool_calls"
        return self._chunk(seq, progress, delta, finish=finish, calls=calls)

    def _detokenize(self, seq: Sequence, progress: _Progress) -> None:
        """Append the new tokens' text, waiting while a character is still incomplete."""
        skip = seq.params.skip_special_tokens
        window = progress.ids[progress.prefix :]
        before = self.tokenizer.decode(
            window[: progress.read - progress.prefix], skip_special_tokens=skip
        )
        after = self.tokenizer.decode(window, skip_special_tokens=skip)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            progress.text += after[len(before) :]
            progress.prefix, progress.read = progress.read, len(progress.ids)

    def _without_stop_prefix(self, text: str) -> str:
        """`text` less any ending that could still grow into a stop string."""
        hold = max((_stop_prefix_at_end(text, stop) for stop in self.stops), default=0)
        return text[: len(text) - hold]

    def _chunk(self, seq, progress, delta: str, *, finish, calls=()) -> dict[str, Any]:
        new_ids = progress.ids[progress.sent_tokens :]
        lps = progress.logprobs[progress.sent_tokens :]
        tops = progress.tops[progress.sent_tokens :]
        progress.sent += delta
        progress.sent_tokens = len(progress.ids)
        as_ids = self.req.return_tokens_as_token_ids
        first = not progress.started
        progress.started = True
        choice: dict[str, Any] = {"index": progress.index}
        logprobs = None
        if self.chat:
            message: dict[str, Any] = {"content": delta} if delta or not calls else {}
            if first:
                message = {"role": "assistant", **message}
            if calls:
                message["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
            choice["delta"] = message
            if seq.params.logprobs is not None:
                logprobs = {
                    "content": chat_logprob_entries(new_ids, lps, tops, self.tokens, as_ids)
                }
        else:
            choice["text"] = delta
            if seq.params.logprobs is not None:
                logprobs = completion_logprobs(
                    new_ids, lps, tops, self.tokens, as_ids,
                    top_k=seq.params.logprobs, offset=progress.offset,
                )  # fmt: skip
                progress.offset += sum(len(t) for t in logprobs["tokens"])
        choice.update(logprobs=logprobs, finish_reason=finish, stop_reason=None)
        if self.req.return_token_ids:
            choice["token_ids"] = new_ids
            if first and not self.chat:
                choice["prompt_token_ids"] = progress.prompt_ids
        body = self._envelope([choice])
        if first and self.chat and self.req.return_token_ids:
            body["prompt_token_ids"] = progress.prompt_ids
        return body

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.id, "object": kind, "created": self.created, "model": self.model,
            "choices": choices,
        }  # fmt: skip

    def _usage(self) -> dict[str, Any]:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(p.ids) for p in self.progress.values())
        body = self._envelope([])
        body["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return body


def _stop_prefix_at_end(text: str, stop: str) -> int:
    """Length of the longest ending of `text` that is a proper prefix of `stop` (0 if none):
    only the places where `stop`'s first character occurs in the tail are tried."""
    tail = text[len(text) - min(len(stop) - 1, len(text)) :]
    start = tail.find(stop[0]) if tail else -1
    while start != -1:
        if stop.startswith(tail[start:]):
            return len(tail) - start
        start = tail.find(stop[0], start + 1)
    return 0


def _sse(body: dict[str, Any]) -> str:
    """One SSE event; a non-finite number becomes null, as in the non-streaming answers
    (a bare NaN is not JSON, and strict clients reject the whole event)."""
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(body), ensure_ascii=False, allow_nan=False)
    return f"data: {text}\n\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def start_stream(
    server: Any,
    req: ChatRequest | CompletionRequest,
    model: str,
    jobs: list[tuple[list[int], Any]],
    adapter: str | None,
    vision: Any = None,
) -> StreamingResponse:
    """Submit the request's sequences (errors such as 429 still come back as JSON) and answer
    with their stream. `server` is the app's `Server`; `vision`: an image prompt's inputs."""
    events = TokenEvents()
    groups, futures = server.submit(jobs, req.n, adapter, on_token=events.on_token, vision=vision)
    for seq, future in zip([s for g in groups for s in g], futures, strict=True):
        future.add_done_callback(lambda _, seq=seq: events.queue.put_nowait(("done", seq, None)))
    prompts = [ids for ids, _ in jobs]
    streamer = Streamer(req, model, groups, prompts, server.tokens, server.tokenizer)
    return _respond(streamer, events)


def _respond(streamer: Streamer, events: TokenEvents) -> StreamingResponse:
    """The SSE answer; a client that goes away (or a failed send) frees its sequences."""

    async def body() -> AsyncIterator[str]:
        try:
            async for line in streamer.events(events.queue):
                yield line
            yield _DONE
        finally:
            abort_unfinished(streamer.seqs)

    return StreamingResponse(body(), media_type="text/event-stream")
