"""Per-row sampling for a batch of sequences: penalties, temperature, truncation, logprobs.

Which distribution the reported logprobs come from (the trainer compares them with its own):
logits -> penalties (repetition, presence, frequency) -> / temperature  =>  **reported logprobs**
(`log_softmax` of this), then min_p -> top_k -> top_p truncate it for **sampling only**.
So a sampled token's logprob is that of the temperature-scaled distribution *before* truncation:
what a trainer recomputes from its logits and the temperature (vLLM reports the same by default).
With top_k/top_p/min_p active, the token was actually drawn from the renormalised truncated
distribution, whose logprob is higher by -log(kept probability mass). Greedy requests
(temperature 0) report the logprobs of the unscaled distribution (temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vfkit.serve.sequence import GREEDY_EPS, SamplingParams

__all__ = ["GREEDY_EPS", "RowInput", "SamplingParams", "StepOutput", "sample_step"]

@dataclass
class RowInput:
    """What the sampler needs to know about one row at this step."""

    params: SamplingParams
    generator: torch.Generator | None
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)


@dataclass
class StepOutput:
    """The sampled token of each row, its logprob, and (id, logprob) top alternatives."""

    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]] | None]


def sample_step(
    logits: torch.Tensor, rows: list[RowInput], generator: torch.Generator | None = None
) -> StepOutput:
    """Sample one token for every row of `logits` [B, V] (float32) according to its params;
    unseeded rows draw from `generator` (None: torch's default one)."""
    logits = _apply_penalties(logits, rows)
    temps = [1.0 if r.params.greedy else r.params.temperature for r in rows]
    if any(t != 1.0 for t in temps):
        logits = logits / torch.tensor(temps, dtype=logits.dtype, device=logits.device)[:, None]
    logprobs = torch.log_softmax(logits, dim=-1)
    tokens = _draw(logits, logprobs, rows, generator)
    sampled = logprobs.gather(1, tokens[:, None])[:, 0]
    return StepOutput(tokens.tolist(), sampled.tolist(), _top_logprobs(logprobs, rows))


def _apply_penalties(logits: torch.Tensor, rows: list[RowInput]) -> torch.Tensor:
    """Repetition penalty over prompt+output (HF/vLLM rule), presence/frequency over the output."""
    penalized = [i for i, r in enumerate(rows) if r.params.penalized]
    if not penalized:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    for i in penalized:
        p, row = rows[i].params, logits[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(rows[i].prompt_ids + rows[i].output_ids, dtype=torch.long)
            seen = seen[seen < vocab].unique().to(row.device)
            vals = row[seen]
            row[seen] = torch.where(
                vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
            )
        if (p.presence_penalty or p.frequency_penalty) and rows[i].output_ids:
            out = torch.tensor(rows[i].output_ids, dtype=torch.long)
            counts = torch.bincount(out[out < vocab], minlength=vocab).to(row)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row)
    return logits


def _truncate(logits: torch.Tensor, rows: list[RowInput]) -> torch.Tensor:
    """Mask (to -inf) what min_p, top_k and top_p exclude, row by row; untouched rows are free."""
    if not any(_truncates(r.params) for r in rows):
        return logits
    logits = logits.clone()
    neg_inf = torch.finfo(logits.dtype).min
    for i, r in enumerate(rows):
        p, row = r.params, logits[i]
        if p.greedy or not _truncates(p):
            continue
        if p.min_p > 0.0:
            probs = torch.softmax(row, dim=-1)
            row.masked_fill_(probs < p.min_p * probs.max(), neg_inf)
        if 0 < p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row.masked_fill_(row < kth, neg_inf)
        if p.top_p < 1.0:
            sorted_vals, order = torch.sort(row, descending=True)
            sorted_probs = torch.softmax(sorted_vals, dim=-1)
            drop = (sorted_probs.cumsum(-1) - sorted_probs) >= p.top_p  # mass before it >= top_p
            row[order[drop]] = neg_inf
    return logits


def _truncates(p: SamplingParams) -> bool:
    return p.min_p > 0.0 or p.top_k > 0 or p.top_p < 1.0


def _draw(
    logits: torch.Tensor, logprobs: torch.Tensor, rows: list[RowInput],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """argmax for greedy rows; else inverse-CDF sampling with one uniform draw per row.

    One uniform per row (from the row's own generator when seeded) keeps a seeded row's
    samples independent of its batch neighbours, and costs far less than per-token noise.
    """
    greedy = [r.params.greedy for r in rows]
    if all(greedy):
        return logits.argmax(dim=-1)
    if any(_truncates(r.params) for r in rows):
        probs = torch.softmax(_truncate(logits, rows), dim=-1)
    else:
        probs = logprobs.exp()
    cdf = probs.cumsum(dim=-1)
    uniform = torch.rand(len(rows), device=logits.device, generator=generator)
    seeded = [i for i, r in enumerate(rows) if r.generator is not None]
    if seeded:  # the rows' own (CPU) generators, moved to the device in one copy
        draws = torch.cat([torch.rand(1, generator=rows[i].generator) for i in seeded])
        uniform[seeded] = draws.to(uniform.device)
    targets = (uniform * cdf[:, -1])[:, None]
    drawn = torch.searchsorted(cdf, targets, right=True)[:, 0].clamp_(max=cdf.shape[1] - 1)
    if any(greedy):
        mask = torch.tensor(greedy, device=logits.device)
        drawn = torch.where(mask, logits.argmax(dim=-1), drawn)
    return drawn


def _top_logprobs(logprobs: torch.Tensor, rows: list[RowInput]):
    """The `k` most likely (id, logprob) pairs of rows that asked for them, else None."""
    want = [r.params.logprobs or 0 for r in rows]
    if max(want) == 0:
        return [[] if r.params.logprobs is not None else None for r in rows]
    values, ids = torch.topk(logprobs, max(want), dim=-1)
    values, ids = values.tolist(), ids.tolist()
    return [
        None if r.params.logprobs is None else list(zip(ids[i][:k], values[i][:k], strict=True))
        for i, (r, k) in enumerate(zip(rows, want, strict=True))
    ]
