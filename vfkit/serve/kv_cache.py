"""A left-padded KV cache whose rows can be replaced, added and dropped between decode steps.

transformers' DynamicCache grows by `torch.cat` on every step (a full copy of the cache per token)
and knows nothing about rows entering or leaving a batch. Continuous batching needs both, so each
layer here keeps a preallocated buffer `[batch, heads, capacity, head_dim]` and writes in place;
all rows share one length, shorter rows are left-padded (masked out by the attention mask).
The cheap operations are the frequent ones: writing a new row into a finished row's slot
(`place`, one row copied) and forgetting leading padding (`trim_left`, a view). Whole-cache
copies (`merge`, `select_rows`, `extend_left`, regrowth) happen only as the batch grows/shrinks.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

_GROW = 64  # spare positions allocated at a time: one regrowth copy per 64 decode steps


class GrowLayer(DynamicLayer):
    """One layer's keys/values in buffers with spare capacity, written in place."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.length = 0
        self.key_buf: torch.Tensor | None = None
        self.value_buf: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        """Append the new positions and return views over everything cached so far."""
        if not self.is_initialized:  # what DynamicLayer.lazy_initialization sets (its
            # signature differs between transformers 4.57 and 5.x; the buffers are ours)
            self.dtype, self.device = key_states.dtype, key_states.device
            self.is_initialized = True
        new = key_states.shape[-2]
        if self.key_buf is None or self.length + new > self.key_buf.shape[-2]:
            self._regrow(self.length + new, like=key_states)
        end = self.length + new
        self.key_buf[:, :, self.length : end] = key_states
        self.value_buf[:, :, self.length : end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self.key_buf[:, :, :length]
        self.values = self.value_buf[:, :, :length]

    def _regrow(self, needed: int, like: torch.Tensor, left: int = 0) -> None:
        """New buffers with room for `needed` positions (+ spare), old ones copied `left` in."""
        batch, heads, _, dim = (like if self.key_buf is None else self.key_buf).shape
        keys = like.new_zeros(batch, heads, needed + _GROW, dim)
        values = like.new_zeros(batch, heads, needed + _GROW, dim)
        if self.key_buf is not None and self.length:
            keys[:, :, left : left + self.length] = self.key_buf[:, :, : self.length]
            values[:, :, left : left + self.length] = self.value_buf[:, :, : self.length]
        self.key_buf, self.value_buf = keys, values

    def trim_left(self, drop: int) -> None:
        """Forget the first `drop` positions (padding for every live row): a view, no copy."""
        self.key_buf = self.key_buf[:, :, drop:]
        self.value_buf = self.value_buf[:, :, drop:]
        self._set_length(self.length - drop)

    def extend_left(self, extra: int) -> None:
        """Add `extra` empty positions in front (a longer prompt is joining): one copy."""
        self._regrow(self.length + extra, like=self.key_buf, left=extra)
        self._set_length(self.length + extra)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (compaction): one copy of what is kept."""
        self.key_buf = self.key_buf[rows, :, : self.length + _GROW].contiguous()
        self.value_buf = self.value_buf[rows, :, : self.length + _GROW].contiguous()
        self._set_length(self.length)

    def place(self, slot: int, other: GrowLayer, row: int) -> None:
        """Overwrite row `slot` with `other`'s row `row`, right-aligned (other must be shorter)."""
        offset = self.length - other.length
        for mine, theirs in ((self.key_buf, other.key_buf), (self.value_buf, other.value_buf)):
            mine[slot, :, :offset] = 0
            mine[slot, :, offset : self.length] = theirs[row, :, : other.length]

    def merge(self, other: GrowLayer) -> None:
        """Append `other`'s rows below ours, right-aligning both to the longer length."""
        length = max(self.length, other.length)
        batch = self.key_buf.shape[0] + other.key_buf.shape[0]
        heads, dim = self.key_buf.shape[1], self.key_buf.shape[3]
        keys = self.key_buf.new_zeros(batch, heads, length + _GROW, dim)
        values = self.value_buf.new_zeros(batch, heads, length + _GROW, dim)
        top = self.key_buf.shape[0]
        for start, stop, src in ((0, top, self), (top, batch, other)):
            offset = length - src.length
            keys[start:stop, :, offset:length] = src.key_buf[:, :, : src.length]
            values[start:stop, :, offset:length] = src.value_buf[:, :, : src.length]
        self.key_buf, self.value_buf = keys, values
        self._set_length(length)


class BatchCache(DynamicCache):
    """A DynamicCache made of GrowLayers, with the row operations of continuous batching."""

    def __init__(self) -> None:
        super(DynamicCache, self).__init__(layer_class_to_replicate=GrowLayer)

    def trim_left(self, drop: int) -> None:
        if drop > 0:
            for layer in self.layers:
                layer.trim_left(drop)

    def extend_left(self, extra: int) -> None:
        if extra > 0:
            for layer in self.layers:
                layer.extend_left(extra)

    def select_rows(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select_rows(rows.to(layer.key_buf.device))

    def place(self, slot: int, other: BatchCache, row: int) -> None:
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.place(slot, theirs, row)

    def merge(self, other: BatchCache) -> None:
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.merge(theirs)
