"""What one generated sequence is: how it is sampled, and what it has produced so far.

Kept free of torch so that the HTTP side (and the scripted test server built on it) can be
imported by code that never loads a model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GREEDY_EPS = 1e-5  # temperatures below this mean greedy decoding (vLLM's threshold)


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is sampled; validated by the HTTP layer before it gets here."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None  # None: no logprobs; k: the sampled token's plus k top ones
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def penalized(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(eq=False)
class Sequence:
    """One generated sequence (a request with n=4 is four of these)."""

    prompt_ids: list[int]
    params: SamplingParams
    adapter: str | None = None
    on_done: Callable[[Sequence], None] | None = None
    # streaming: called on the worker thread with (seq, token, logprob, top) for each new token
    on_token: Callable[[Sequence, int, float | None, Any], None] | None = None
    generator: Any = None  # torch.Generator, for a seeded request
    vision: Any = None  # an image prompt's vision.VisionInputs (shared by its n), until prefill
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]] | None] = field(default_factory=list)
    finish_reason: str | None = None
    text: str = ""
    error: BaseException | None = None
    aborted: bool = False
    queued_at: float = 0.0  # time.monotonic() at submit


def abort_unfinished(seqs: list[Sequence]) -> None:
    """Let the engine drop the unfinished ones (their client is gone or the answer failed)."""
    for seq in seqs:
        if seq.finish_reason is None:
            seq.aborted = True
