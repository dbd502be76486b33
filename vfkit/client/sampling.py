"""Sampling arguments: the one place that decides which value wins.

Precedence, lowest first (each layer only overrides the keys it sets):

    built-in defaults  <  the environment's own `sampling_args`  <  the run's config
    (keys written in [trainer.args] or given as vf-eval flags)  <  per-call arguments

Training stacks its three lower layers in `TrainerArgs.rollout_sampling_args`
(vfkit/train/config.py) and passes the result per call; vf-eval passes its flags per call;
the environment merges its own under them (`Environment.merge_sampling_args`).

vLLM-only knobs (`top_k`, `min_p`, ...) may be given at top level or inside `extra_body`; both
spellings are the same key, and `extra_body` dicts merge key by key:

    merge_sampling_args({"max_tokens": 48, "top_k": 5}, {"temperature": 0.7})
    # {'max_tokens': 48, 'temperature': 0.7, 'extra_body': {'top_k': 5}}

`max_tokens` and `max_completion_tokens` are one limit spelled two ways: a layer that sets
either replaces both below it (the server never gets two limits).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any

from vfkit.types import SamplingArgs

# Sampling knobs the openai client does not know as keywords: they travel in extra_body.
EXTRA_BODY_KEYS = (
    "top_k", "min_p", "repetition_penalty", "return_token_ids", "skip_special_tokens",
)
TOKEN_LIMIT_KEYS = ("max_tokens", "max_completion_tokens")  # one limit, two spellings


def sampling_keys() -> frozenset[str]:
    """Every key a sampling-args dict may hold: a keyword of the installed openai client's
    chat or completions `create()` (whatever its version), or a vLLM knob of EXTRA_BODY_KEYS.
    The caller decides which of them it lets users set (the prompt and model are its own)."""
    import inspect

    from openai.resources.chat.completions import AsyncCompletions as Chat
    from openai.resources.completions import AsyncCompletions as Text

    names = {*inspect.signature(Chat.create).parameters, *inspect.signature(Text.create).parameters}
    return frozenset(names - {"self"}) | frozenset(EXTRA_BODY_KEYS)


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
        if any(key in normal for key in TOKEN_LIMIT_KEYS):
            for key in TOKEN_LIMIT_KEYS:
                merged.pop(key, None)
        merged.update(normal)
    if extra:
        merged["extra_body"] = extra
    return merged


def drop_sampling_keys(args: SamplingArgs | None, keys: Sequence[str]) -> SamplingArgs:
    """A copy of `args` without `keys`, at top level or inside extra_body (vf-eval's
    `-S '{"max_tokens": null}'` removes the environment's own limit this way). Dropping either
    token-limit spelling drops both."""
    if set(keys) & set(TOKEN_LIMIT_KEYS):
        keys = [*keys, *TOKEN_LIMIT_KEYS]
    out = normalize_sampling_args(args)
    extra = out.pop("extra_body", {})
    out = {k: v for k, v in out.items() if k not in keys}
    extra = {k: v for k, v in extra.items() if k not in keys}
    return {**out, "extra_body": extra} if extra else out


SEED_RANGE = 2**63  # the servers' (vLLM, vf-serve, OpenAI) seed is a signed 64-bit integer


def derive_seed(seed: int, *parts: int | str) -> int:
    """A seed for one part of a run (a step, a group, a turn) from the run's `seed`.

    A hash, not a sum: nearby runs, steps and groups get unrelated streams, and the same
    (seed, parts) always gives the same value, in any process (unlike Python's `hash`).
    """
    text = ":".join(str(p) for p in (seed, *parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") % SEED_RANGE


def with_seed(args: SamplingArgs, seed: int | None) -> SamplingArgs:
    """`args` with `seed` (unchanged when None)."""
    return args if seed is None else {**args, "seed": seed % SEED_RANGE}


def seed_groups(args: SamplingArgs, rows: list[dict[str, Any]]) -> list[SamplingArgs]:
    """The args of each row's group in one seeded call: a seed derived from (seed, example_id,
    how often that id came before), so groups draw independent streams and a rerun, or a
    resumed eval that passes only the missing rows, gives each group the same ones."""
    seed = _seed_of(args)
    if seed is None:
        return [args] * len(rows)
    seen: dict[str, int] = {}
    out = []
    for i, row in enumerate(rows):
        key = str(row.get("example_id", f"row{i}"))
        seen[key] = seen.get(key, -1) + 1
        out.append(with_seed(args, derive_seed(seed, "group", key, seen[key])))
    return out


def seed_rollout(args: SamplingArgs, index: int) -> SamplingArgs:
    """The args of rollout `index` of a group: the group's `seed` + index (none: unchanged).

    As sample k of one request with n > 1 gets in vLLM and vf-serve: a seeded group's
    completions differ from each other and repeat from run to run.
    """
    seed = _seed_of(args)
    return args if seed is None else with_seed(args, seed + index)


def seed_rollouts(args: SamplingArgs, n: int,
                  indices: Sequence[int] | None = None) -> list[SamplingArgs]:
    """The args of a group's `n` rollouts; `indices` says which rollouts of the group they are
    (default 0 .. n-1), so a resumed eval's missing rollouts get the seeds they had."""
    indices = range(n) if indices is None else indices
    if len(indices) != n:
        raise ValueError(f"{n} rollouts but rollout_indices {list(indices)}; give one per rollout")
    return [seed_rollout(args, k) for k in indices]


def seed_turn(args: SamplingArgs, turn: int) -> SamplingArgs:
    """The args of a rollout's model call number `turn` (0 = first): each turn draws afresh."""
    seed = _seed_of(args)
    return args if seed is None or turn == 0 else with_seed(args, derive_seed(seed, "turn", turn))


def _seed_of(args: SamplingArgs) -> int | None:
    seed = args.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None
