"""The running batch's KV cache at fixed addresses, for decode steps replayed as CUDA graphs.

A CUDA graph replays kernels on the exact tensors it was captured with, so the cache a captured
decode step writes into can never move. `StaticCache` keeps one preallocated arena per layer,
`[max_rows, kv_heads, capacity, head_dim]`, and does the row operations of continuous batching
(`kv_cache.BatchCache`'s: place, merge, select_rows, trim_left, extend_left) in place. Rows and
positions use the same layout as BatchCache: rows `[0, rows)`, all right-aligned to one shared
`length`, shorter rows left-padded (zeros, masked out).

A decode step writes position `length` of every row through `write_index` (a device tensor, so
a replay writes where the current step is, not where the capture was) and attends over the
fixed window `[:view_rows, :, :view_length]` that the step's graph was captured for
(`graphs.py`). The arena grows (new addresses: `generation` changes, graphs are re-captured)
only when a batch outgrows it, which doubling makes rare.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from vfkit.serve.kv_cache import BatchCache

_MIN_CAPACITY = 128


class StaticLayer(DynamicLayer):
    """One layer's arena; written only by decode steps (StaticCache.view set)."""

    def __init__(self, owner: StaticCache) -> None:
        super().__init__()
        self.owner = owner
        self.key_buf: torch.Tensor | None = None
        self.value_buf: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        """Write the step's keys/values at `write_index`; return the step's attention window."""
        rows, length = self.owner.view
        index = self.owner.write_index
        self.key_buf[:rows].index_copy_(2, index, key_states.to(self.key_buf.dtype))
        self.value_buf[:rows].index_copy_(2, index, value_states.to(self.value_buf.dtype))
        return self.key_buf[:rows, :, :length], self.value_buf[:rows, :, :length]

    def get_seq_length(self) -> int:
        return self.owner.length

    def allocate(self, like: torch.Tensor, rows: int, capacity: int) -> None:
        """(Re)allocate the arena, keeping what the old one held."""
        _, heads, _, dim = like.shape
        keys = like.new_zeros(rows, heads, capacity, dim)
        values = like.new_zeros(rows, heads, capacity, dim)
        if self.key_buf is not None:
            used = self.owner.length
            keys[:, :, :used] = self.key_buf[:, :, :used]
            values[:, :, :used] = self.value_buf[:, :, :used]
        self.key_buf, self.value_buf = keys, values
        self.is_initialized = True
        self.dtype, self.device = like.dtype, like.device


class StaticCache(Cache):
    """KV arenas for up to `max_rows` rows of up to `max_length` positions, edited in place."""

    def __init__(self, num_layers: int, max_rows: int, max_length: int) -> None:
        super().__init__(layers=[StaticLayer(self) for _ in range(num_layers)])
        self.max_rows = max_rows
        self.max_length = max_length
        self.capacity = 0
        self.rows = 0  # rows in use (RunningBatch slots, dead ones included)
        self.length = 0  # positions in use, shared by every row
        self.generation = 0  # bumped whenever the arenas move (captured graphs go stale)
        self.view: tuple[int, int] = (0, 0)  # (rows, positions) the current decode step sees
        self.write_index: torch.Tensor | None = None  # [1] long: where the step writes

    def reset(self) -> StaticCache:
        """Empty (the arenas stay allocated, so graphs captured on them stay valid)."""
        self.rows = self.length = 0
        return self

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def ensure_capacity(self, length: int, like: torch.Tensor | None = None) -> None:
        """Room for `length` positions: grow the arenas (doubling) when needed."""
        if length <= self.capacity:
            return
        if length > self.max_length:
            raise RuntimeError(
                f"the batch needs {length} cached positions but the static cache holds at most "
                f"{self.max_length}; this is a bug in the batch bookkeeping"
            )
        capacity = max(_MIN_CAPACITY, self.capacity)
        while capacity < length:
            capacity *= 2
        capacity = min(capacity, self.max_length)
        for layer in self.layers:
            src = like if layer.key_buf is None else layer.key_buf
            layer.allocate(src, self.max_rows, capacity)
        self.capacity = capacity
        self.generation += 1

    # ---- the row operations of continuous batching (BatchCache's, in place) ----
    def merge(self, other: BatchCache) -> None:
        """Append `other`'s rows below ours, right-aligned to the longer length."""
        count = other.layers[0].key_buf.shape[0]
        if self.rows + count > self.max_rows:
            raise RuntimeError(f"{self.rows} + {count} rows exceed the cache's {self.max_rows}")
        if other.layers[0].length > self.length:
            self.extend_left(other.layers[0].length - self.length, like=other)
        self.ensure_capacity(self.length, like=other.layers[0].key_buf)
        for row in range(count):
            self._write_row(self.rows + row, other, row)
        self.rows += count

    def place(self, slot: int, other: BatchCache, row: int) -> None:
        """Overwrite row `slot` with `other`'s row `row`, right-aligned (other is not longer)."""
        self._write_row(slot, other, row)

    def _write_row(self, slot: int, other: BatchCache, row: int) -> None:
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            offset = self.length - theirs.length
            for buf, src in ((mine.key_buf, theirs.key_buf), (mine.value_buf, theirs.value_buf)):
                buf[slot, :, :offset] = 0
                buf[slot, :, offset : self.length] = src[row, :, : theirs.length]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the rows `rows`, moved to the top (compaction)."""
        idx = rows.to(self.layers[0].key_buf.device)
        for layer in self.layers:
            for buf in (layer.key_buf, layer.value_buf):
                buf[: len(idx), :, : self.length] = buf[idx, :, : self.length]
        self.rows = len(idx)

    def trim_left(self, drop: int) -> None:
        """Forget the first `drop` positions (padding for every row): shift the rest left."""
        if drop <= 0:
            return
        kept = self.length - drop
        for layer in self.layers:
            for buf in (layer.key_buf, layer.value_buf):
                buf[:, :, :kept] = buf[:, :, drop : self.length].clone()
        self.length = kept

    def extend_left(self, extra: int, like: BatchCache | None = None) -> None:
        """Add `extra` empty positions in front (a longer prompt is joining)."""
        if extra <= 0:
            return
        seed = like.layers[0].key_buf if like is not None else None
        self.ensure_capacity(self.length + extra, like=seed)
        for layer in self.layers:
            for buf in (layer.key_buf, layer.value_buf):
                buf[:, :, extra : extra + self.length] = buf[:, :, : self.length].clone()
                buf[:, :, :extra] = 0
        self.length += extra

    def worth_trimming(self, drop: int) -> bool:
        """A trim copies the arena, so only for a sizeable drop (the mask hides the rest), or
        when the next step would not fit (then the shortest-padded row is not at its limit,
        so there is padding to drop: every row ends by max_model_len = max_length - 1)."""
        return drop >= max(32, self.length // 4) or self.length + 1 >= self.max_length
