"""The rows decoded together: slots, their shared KV cache, attention mask and positions.

A finished row leaves a dead slot (None) behind instead of forcing a copy of the whole cache;
the next admitted sequence is written into it (one row copied). Dead slots keep being computed
(their output is ignored) until the batch is compacted, once `compact_at` of its slots are dead.
On a GPU a decode step streams the weights once whatever the rows, so dead rows cost little and
the default (half) keeps a busy server from copying its cache, and a draining one copies it a
logarithmic number of times. On a CPU a step's cost grows with its rows (SmolLM2, one thread:
~120 ms + ~8 ms a row; a copy of 28 rows' cache ~55 ms), and a draining GRPO batch computed
~30 % dead rows at half: the engine compacts at an eighth there (~4 %).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from vfkit.serve.kv_cache import BatchCache

if TYPE_CHECKING:
    from vfkit.serve.sequence import Sequence


class RunningBatch:
    """Slots (a Sequence, or None once finished) and per-slot tensors, aligned to the right."""

    def __init__(
        self,
        slots: list[Sequence | None] | None = None,
        cache: BatchCache | None = None,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        last: torch.Tensor | None = None,
        *,
        new_cache: Callable[[], Any] | None = None,
        compact_at: float = 0.5,
    ) -> None:
        self.new_cache = new_cache  # None: adopt the first group's cache; else an empty one
        self.compact_at = compact_at  # share of dead slots that triggers a compaction
        self.slots: list[Sequence | None] = slots or []
        self.cache = cache
        self.mask = mask  # [S, L] long, 1 = a real token, leading 0s = left padding
        self.positions = positions  # [S] position id of the next token
        self.last = last  # [S] the token fed at the next step

    @property
    def rows(self) -> list[Sequence]:
        """The live sequences, in slot order."""
        return [s for s in self.slots if s is not None]

    def live(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s is not None]

    def adapters(self) -> list[str | None]:
        """Per-slot adapter; dead slots borrow a live row's so one-adapter batches stay so."""
        rows = self.rows
        filler = rows[0].adapter if rows else None
        return [filler if s is None else s.adapter for s in self.slots]

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input ids [S, 1], attention mask [S, L+1], position ids [S, 1]) for a decode step."""
        ones = torch.ones((len(self.slots), 1), dtype=self.mask.dtype)
        self.mask = torch.cat([self.mask, ones], dim=1)
        return self.last[:, None], self.mask, self.positions[:, None]

    def advance(self, live: list[int], tokens: list[int]) -> None:
        """Record the tokens sampled for the live slots (dead slots keep their position)."""
        idx = torch.tensor(live)
        self.positions[idx] += 1
        self.last[idx] = torch.tensor(tokens, dtype=self.last.dtype)

    def add(self, group: RunningBatch) -> None:
        """Take in a freshly prefilled group: into dead slots first, appended otherwise."""
        if not self.rows:
            cache = group.cache
            if self.new_cache is not None:  # the static arena: copy the group's rows in
                cache = self.new_cache()
                cache.merge(group.cache)
            self._reset(group.slots, cache, group.mask, group.positions, group.last)
            return
        width, length = group.mask.shape[1], self.mask.shape[1]
        if width > length:  # a prompt longer than the batch: make room on the left
            self.cache.extend_left(width - length)
            self.mask = _left_pad(self.mask, width)
            length = width
        free = [i for i, s in enumerate(self.slots) if s is None]
        rest = []
        for j, seq in enumerate(group.slots):
            if not free:
                rest.append(j)
                continue
            slot = free.pop(0)
            self.cache.place(slot, group.cache, j)
            self.mask[slot] = _left_pad(group.mask[j : j + 1], length)[0]
            self.positions[slot] = group.positions[j]
            self.last[slot] = group.last[j]
            self.slots[slot] = seq
        if rest:
            self._append(group.select(rest))

    def _append(self, group: RunningBatch) -> None:
        length = max(self.mask.shape[1], group.mask.shape[1])
        self.cache.merge(group.cache)
        self.mask = torch.cat([_left_pad(self.mask, length), _left_pad(group.mask, length)])
        self.positions = torch.cat([self.positions, group.positions])
        self.last = torch.cat([self.last, group.last])
        self.slots = self.slots + group.slots

    def select(self, keep: list[int]) -> RunningBatch:
        """This batch reduced to the slots `keep` (copies the cache rows)."""
        idx = torch.tensor(keep)
        self.cache.select_rows(idx)
        return RunningBatch(
            [self.slots[i] for i in keep],
            self.cache,
            self.mask[idx],
            self.positions[idx],
            self.last[idx],
        )

    def retire(
        self, finished: Callable[[Sequence], bool], done: Callable[[Sequence], None]
    ) -> None:
        """Free the slots of finished rows (calling `done`), compact or trim when worth it."""
        ended = [i for i, s in enumerate(self.slots) if s is not None and finished(s)]
        for i in ended:
            done(self.slots[i])
            self.slots[i] = None
        live = self.live()
        if not live:
            self._reset()
            return
        if len(self.slots) - len(live) >= self.compact_at * len(self.slots):
            compact = self.select(live)
            self._reset(
                compact.slots, compact.cache, compact.mask, compact.positions, compact.last
            )
        drop = int(self.mask[torch.tensor(self.live())].argmax(dim=1).min())
        worth = getattr(self.cache, "worth_trimming", None)
        if drop and (worth is None or worth(drop)):  # columns of padding for every live row
            self.cache.trim_left(drop)
            self.mask = self.mask[:, drop:]

    def _reset(self, *state: Any) -> None:
        self.__init__(*state, new_cache=self.new_cache, compact_at=self.compact_at)


def _left_pad(mask: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - mask.shape[1]
    if pad == 0:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], pad), mask], dim=1)
