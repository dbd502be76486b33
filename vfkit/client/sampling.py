"""Sampling arguments: the one place that decides which value wins.

Precedence, lowest first (each layer only overrides the keys it sets):

    built-in defaults  <  the environment's own `sampling_args`  <  the run's config
    (keys written in [trainer.args] or given as vf-eval flags)  <  per-call arguments

vLLM-only knobs (`top_k`, `min_p`, ...) may be given at top level or inside `extra_body`; both
spellings are the same key, and `extra_body` dicts merge key by key:

    merge_sampling_args({"max_tokens": 48, "top_k": 5}, {"temperature": 0.7})
    # {'max_tokens': 48, 'temperature': 0.7, 'extra_body': {'top_k': 5}}
"""

from __future__ import annotations

import copy
from typing import Any

from vfkit.types import SamplingArgs

# Sampling knobs the openai client does not know as keywords: they travel in extra_body.
EXTRA_BODY_KEYS = (
    "top_k", "min_p", "repetition_penalty", "return_token_ids", "skip_special_tokens",
)


def normalize_sampling_args(args: SamplingArgs | None) -> SamplingArgs:
    """A copy with vLLM-only knobs moved into extra_body and None values dropped."""
    out = copy.deepcopy(dict(args or {}))
    extra = dict(out.pop("extra_body", None) or {})
    for key in EXTRA_BODY_KEYS:
        if key in out:
            extra[key] = out.pop(key)
    out = {k: v for k, v in out.items() if v is not None}
    extra = {k: v for k, v in extra.items() if v is not None}
    if extra:
        out["extra_body"] = extra
    return out


def merge_sampling_args(*layers: SamplingArgs | None) -> SamplingArgs:
    """Merge layers lowest precedence first: later layers win key by key (extra_body too)."""
    merged: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for layer in layers:
        normal = normalize_sampling_args(layer)
        extra.update(normal.pop("extra_body", {}))
        merged.update(normal)
    if extra:
        merged["extra_body"] = extra
    return merged
