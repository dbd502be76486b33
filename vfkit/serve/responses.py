"""Response bodies in vLLM's shape (OpenAI fields plus `prompt_token_ids` / `token_ids`)."""

from __future__ import annotations

import time
import uuid
from functools import lru_cache
from typing import Any

from vfkit.serve.protocol import ChatRequest, CompletionRequest
from vfkit.serve.sequence import Sequence
from vfkit.serve.tool_calls import parse_tool_calls


class TokenText:
    """Display strings of single tokens (for logprobs), cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.text = lru_cache(maxsize=200_000)(self._text)

    def _text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def show(self, token_id: int, as_ids: bool) -> str:
        """vLLM's `--return-tokens-as-token-ids` form is "token_id:<id>"."""
        return f"token_id:{token_id}" if as_ids else self.text(token_id)


def usage(prompt_tokens: int, seqs: list[Sequence]) -> dict[str, int]:
    """OpenAI's `usage`: prompt tokens (given) and the sequences' sampled tokens."""
    completion = sum(len(s.output_ids) for s in seqs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def chat_response(
    req: ChatRequest, model: str, prompt_ids: list[int], seqs: list[Sequence], tokens: TokenText
) -> dict[str, Any]:
    """The body of a /v1/chat/completions answer."""
    choices = []
    for index, seq in enumerate(seqs):
        content, calls = seq.text, []
        if req.parses_tools():
            content, calls = parse_tool_calls(seq.text)
        finish = "tool_calls" if calls else seq.finish_reason
        choices.append(
            {
                "index": index,
                "message": {"role": "assistant", "content": content, "tool_calls": calls or None},
                "logprobs": _chat_logprobs(seq, tokens, req.return_tokens_as_token_ids),
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": seq.output_ids if req.return_token_ids else None,
            }
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(len(prompt_ids), seqs),
        "prompt_token_ids": prompt_ids if req.return_token_ids else None,
    }


def _chat_logprobs(seq: Sequence, tokens: TokenText, as_ids: bool) -> dict[str, Any] | None:
    if seq.params.logprobs is None:
        return None
    return {"content": chat_logprob_entries(seq.output_ids, seq.logprobs, seq.top_logprobs,
                                            tokens, as_ids)}  # fmt: skip


def chat_logprob_entries(
    ids: list[int],
    logprobs: list[float],
    tops: list[list[tuple[int, float]] | None],
    tokens: TokenText,
    as_ids: bool,
) -> list[dict[str, Any]]:
    """`logprobs.content` entries of chat answers (and of stream chunks) for these tokens."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tokens.show(token_id, as_ids)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for token_id, logprob, top in zip(ids, logprobs, tops, strict=True):
        item = entry(token_id, logprob)
        item["top_logprobs"] = [entry(i, lp) for i, lp in top or []]
        content.append(item)
    return content


def completion_response(
    req: CompletionRequest,
    model: str,
    prompts: list[list[int]],
    groups: list[list[Sequence]],
    tokens: TokenText,
) -> dict[str, Any]:
    """The body of a /v1/completions answer; choice index = prompt index * n + sample index."""
    choices = []
    for prompt_ids, seqs in zip(prompts, groups, strict=True):
        for seq in seqs:
            choices.append(
                {
                    "index": len(choices),
                    "text": seq.text,
                    "logprobs": _completion_logprobs(seq, tokens, req.return_tokens_as_token_ids),
                    "finish_reason": seq.finish_reason,
                    "stop_reason": None,
                    "prompt_token_ids": prompt_ids if req.return_token_ids else None,
                    "token_ids": seq.output_ids if req.return_token_ids else None,
                }
            )
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(sum(map(len, prompts)), [s for g in groups for s in g]),
    }


def _completion_logprobs(seq: Sequence, tokens: TokenText, as_ids: bool) -> dict[str, Any] | None:
    if seq.params.logprobs is None:
        return None
    return completion_logprobs(
        seq.output_ids, seq.logprobs, seq.top_logprobs, tokens, as_ids,
        top_k=seq.params.logprobs, offset=0,
    )  # fmt: skip


def completion_logprobs(
    ids: list[int],
    logprobs: list[float],
    tops: list[list[tuple[int, float]] | None],
    tokens: TokenText,
    as_ids: bool,
    *,
    top_k: int,
    offset: int,
) -> dict[str, Any]:
    """Text-completion `logprobs` for these tokens; `offset`: text length before the first."""
    strings = [tokens.show(t, as_ids) for t in ids]
    offsets = []
    for s in strings:
        offsets.append(offset)
        offset += len(s)
    top = None
    if top_k > 0:
        top = []
        for token_id, logprob, alts in zip(ids, logprobs, tops, strict=True):
            entry = {tokens.show(i, as_ids): lp for i, lp in alts or []}
            entry.setdefault(tokens.show(token_id, as_ids), logprob)  # vLLM adds the sampled one
            top.append(entry)
    return {
        "tokens": strings,
        "token_logprobs": list(logprobs),
        "top_logprobs": top,
        "text_offset": offsets,
    }
