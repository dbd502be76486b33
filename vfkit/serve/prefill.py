"""What one prefill forward runs: each distinct prompt once, and which admitted row copies which.

A GRPO batch asks for every prompt G times (G requests, or one request with n=G). Those rows
are equal until their first sampled token, so their prompt runs once and its keys/values and
last-position logits are copied to the others (`BatchCache.select_rows` with repeated rows):
the prefill of 4 prompts x 8 completions forwards 4 rows, not 32. On SmolLM2 with one CPU
thread that prefill was ~30 % of the batch's generation time (benchmarks/RESULTS.md).
Each copy then samples with its own generator, as it would have after its own prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from vfkit.serve.kv_cache import BatchCache
    from vfkit.serve.sequence import Sequence


def prompt_key(seq: Sequence) -> tuple[Any, ...]:
    """Rows with equal keys have equal prefills: same adapter, same tokens, same images (the
    n samples of an image prompt share one VisionInputs object)."""
    return (seq.adapter, id(seq.vision), tuple(seq.prompt_ids))


@dataclass
class PrefillPlan:
    """The left-padded inputs of the distinct prompts, and each admitted row's source row."""

    distinct: list[Sequence]  # the rows the forward runs, in first-seen order
    source: torch.Tensor  # [admitted] index into `distinct`
    ids: torch.Tensor  # [distinct, width]
    mask: torch.Tensor  # [distinct, width] 1 = a real token, leading 0s = padding
    positions: torch.Tensor  # [distinct, width] position ids

    @property
    def shared(self) -> int:
        """Admitted rows whose prompt another row's forward computed."""
        return len(self.source) - len(self.distinct)

    def next_positions(self) -> torch.Tensor:
        return torch.tensor([len(s.prompt_ids) for s in self.distinct])

    def expand(
        self, cache: BatchCache, logits: torch.Tensor, *per_row: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Copy the distinct rows' cache rows, logits and `per_row` tensors to every admitted
        row (in admission order); a no-op when every prompt was distinct."""
        if not self.shared:
            return (logits, *per_row)
        cache.select_rows(self.source)
        rows = [t[self.source.to(t.device)] for t in per_row]
        return (logits[self.source.to(logits.device)], *rows)


def plan_prefill(rows: list[Sequence], pad_id: int) -> PrefillPlan:
    """Group `rows` by prompt (see `prompt_key`) and left-pad the distinct prompts."""
    index: dict[tuple[Any, ...], int] = {}
    distinct: list[Sequence] = []
    source = []
    for seq in rows:
        key = prompt_key(seq)
        if key not in index:
            index[key] = len(distinct)
            distinct.append(seq)
        source.append(index[key])
    width = max(len(s.prompt_ids) for s in distinct)
    ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(distinct), width), dtype=torch.long)
    for i, s in enumerate(distinct):
        ids[i, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)
        mask[i, width - len(s.prompt_ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return PrefillPlan(distinct, torch.tensor(source), ids, mask, positions)
