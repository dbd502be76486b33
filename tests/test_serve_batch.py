"""The running batch's compaction rule: when finished rows' slots are copied away."""

from __future__ import annotations

import torch

from vfkit.serve.batch import RunningBatch
from vfkit.serve.kv_cache import BatchCache
from vfkit.serve.sequence import SamplingParams, Sequence


def batch_of(rows: int, compact_at: float) -> RunningBatch:
    cache = BatchCache()
    keys = torch.arange(rows, dtype=torch.float32).reshape(rows, 1, 1, 1).expand(rows, 1, 3, 2)
    cache.update(keys.clone(), keys.clone(), 0)  # row i's keys are all i
    seqs = [Sequence([1, 2, 3], SamplingParams()) for _ in range(rows)]
    mask = torch.ones(rows, 3, dtype=torch.long)
    last = torch.zeros(rows, dtype=torch.long)
    return RunningBatch(seqs, cache, mask, torch.full((rows,), 3), last, compact_at=compact_at)


def finish(batch: RunningBatch, which: set[int]) -> list[Sequence]:
    ended = [batch.slots[i] for i in which]
    done: list[Sequence] = []
    batch.retire(lambda s: s in ended, done.append)
    assert done == ended
    return done


def test_half_dead_before_a_copy_by_default():
    batch = batch_of(8, compact_at=0.5)
    finish(batch, {1, 4, 6})
    assert len(batch.slots) == 8 and batch.slots[1] is None  # 3 of 8 dead: kept, computed
    finish(batch, {0})
    assert len(batch.slots) == 4  # half: compacted


def test_an_eighth_dead_is_compacted_and_the_cache_rows_follow():
    batch = batch_of(8, compact_at=0.125)
    kept = [s for i, s in enumerate(batch.slots) if i != 5]
    finish(batch, {5})
    assert batch.slots == kept
    rows = batch.cache.layers[0].keys[:, 0, 0, 0].tolist()
    assert rows == [0, 1, 2, 3, 4, 6, 7]  # each live row keeps its own keys
    assert batch.mask.shape == (7, 3) and batch.positions.shape == (7,)
