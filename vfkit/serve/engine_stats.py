"""The generation worker's cumulative counters, shown by GET /stats (and benchmarks/serve.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Cumulative counters (seconds, steps, tokens) since start; GET /stats shows them."""

    busy_s: float = 0.0  # worker iterations with work, all included
    prefill_s: float = 0.0  # prompt forwards
    decode_s: float = 0.0  # one-token forwards
    sample_s: float = 0.0  # logits -> tokens and logprobs
    prefill_tokens: int = 0  # prompt tokens forwarded (each distinct prompt of a prefill once)
    prefill_shared: int = 0  # admitted rows whose equal prompt another row's forward computed
    prefills: int = 0  # prefill forwards (groups of admitted sequences)
    admitted: int = 0  # sequences prefilled (each samples its first token there)
    queue_wait_s: float = 0.0  # summed over sequences: submit -> end of its prefill
    decode_steps: int = 0
    decode_rows: int = 0  # sum of live rows over decode steps
    decode_slots: int = 0  # sum of rows computed (live + finished, not yet compacted away)
    graph_replays: int = 0  # decode steps replayed from a CUDA graph (graphs.py)
    graph_captures: int = 0  # graphs captured (first use of a shape/adapter, or stale)
    finished: int = 0
    aborted: int = 0
