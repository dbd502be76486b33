"""Turn a server response into the token view of one model call (never re-tokenizing text).

The ids and logprobs are vLLM's: `prompt_token_ids` (top level for chat, per choice for
completions), `choices[0].token_ids`, and the per-token logprobs. `max_seq_len`, when given,
follows the trainer's limit (client/limits.py): a prompt longer than it is marked
`overlong_prompt` (its completion is dropped), and a completion that would run past it is cut
and marked `is_truncated`.
"""

from __future__ import annotations

from typing import Any

from vfkit.client.limits import SequenceLimits
from vfkit.types import TokenFields


def _logprobs(choice: dict[str, Any]) -> list[float] | None:
    lp = choice.get("logprobs")
    if not lp:
        return None
    if lp.get("content") is not None:  # chat
        return [float(entry["logprob"]) for entry in lp["content"]]
    if lp.get("token_logprobs") is not None:  # completions
        return [float(x) if x is not None else 0.0 for x in lp["token_logprobs"]]
    return None


def parse_tokens(response: dict[str, Any], max_seq_len: int | None = None) -> TokenFields | None:
    """TokenFields of a response's first choice, or None when the server sent no ids/logprobs."""
    choice = response["choices"][0]
    prompt_ids = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    logprobs = _logprobs(choice)
    if prompt_ids is None or completion_ids is None or logprobs is None:
        return None
    if len(logprobs) != len(completion_ids):
        return None  # a server that drops some logprobs cannot be trained on safely
    n_prompt, n_completion, overlong = SequenceLimits(max_seq_len).clip(prompt_ids, completion_ids)
    is_truncated = (choice.get("finish_reason") == "length" or overlong
                    or n_completion < len(completion_ids))
    prompt_ids, completion_ids = prompt_ids[:n_prompt], completion_ids[:n_completion]
    logprobs = logprobs[:n_completion]
    return TokenFields(
        prompt_ids=list(prompt_ids),
        prompt_mask=[0] * len(prompt_ids),
        completion_ids=list(completion_ids),
        completion_mask=[1] * len(completion_ids),
        completion_logprobs=logprobs,
        overlong_prompt=overlong,
        is_truncated=is_truncated,
    )
