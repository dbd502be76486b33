"""Decode steps as replayed CUDA graphs: the GPU server's answer to being launch-bound.

A small model's decode step is ~2,000 tiny kernels; launched one by one from Python they take
30-70 ms on an H100 whose arithmetic takes ~4 ms (measured, benchmarks/RESULTS.md). Captured
once as a CUDA graph, the same step replays in about the arithmetic's time.

`StaticDecoder.step` runs a decode step over a `StaticCache` (static_cache.py). Shapes are
bucketed, rows to a power of two up to max_batch, positions to a power of two up to the
arena's capacity, so a handful of graphs serve every batch. A graph is captured on first use
of its (rows, positions, adapter) bucket and dropped when what it captured goes stale: the
arenas grew, or an adapter was loaded, reloaded or unloaded (LoraManager.generation). Steps
that cannot be captured (rows on different adapters) run the same static step eagerly, and so
does everything with `capture=False`, which is how the CPU tests check the static path.
Rows beyond the batch in a bucket are fillers: token 0 at position 0, seeing only position 0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from vfkit.serve.lora import LoraManager
from vfkit.serve.static_cache import StaticCache

log = logging.getLogger("vfkit.serve")
_MIN_POSITIONS = 64


def bucket(n: int, low: int, high: int) -> int:
    """The smallest power of two >= n (at least `low`), capped at `high`."""
    size = low
    while size < n:
        size *= 2
    return min(size, high)


@dataclass
class StepInputs:
    """The fixed input/output tensors of one (rows, positions) bucket."""

    ids: torch.Tensor  # [R, 1] long
    positions: torch.Tensor  # [R, 1] long
    mask: torch.Tensor  # [R, 1, 1, L] bool, True = attend
    write_index: torch.Tensor  # [1] long
    logits: torch.Tensor  # [R, vocab] float32

    @classmethod
    def allocate(cls, rows: int, length: int, vocab: int, device: torch.device) -> StepInputs:
        return cls(
            ids=torch.zeros((rows, 1), dtype=torch.long, device=device),
            positions=torch.zeros((rows, 1), dtype=torch.long, device=device),
            mask=torch.zeros((rows, 1, 1, length), dtype=torch.bool, device=device),
            write_index=torch.zeros(1, dtype=torch.long, device=device),
            logits=torch.zeros((rows, vocab), dtype=torch.float32, device=device),
        )

    def fill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> None:
        """This step's inputs; filler rows see position 0 only (no empty softmax)."""
        rows, width = mask.shape
        self.ids.zero_()
        self.positions.zero_()
        self.mask.zero_()
        self.mask[rows:, 0, 0, 0] = True
        device = self.ids.device
        self.ids[:rows].copy_(ids.to(device, non_blocking=True))
        self.positions[:rows].copy_(positions.to(device, non_blocking=True))
        self.mask[:rows, 0, 0, :width].copy_(mask.to(device, non_blocking=True).bool())
        self.write_index.fill_(width - 1)


class StaticDecoder:
    """Decode steps over a StaticCache, replayed from CUDA graphs where possible."""

    def __init__(self, lora: LoraManager, *, max_rows: int, max_length: int, capture: bool):
        model = lora.model
        self.lora = lora
        self.capture = capture
        self.device = next(model.parameters()).device
        config = model.config.get_text_config()
        self.vocab = model.get_output_embeddings().weight.shape[0]
        self.cache = StaticCache(config.num_hidden_layers, max_rows, max_length)
        self.max_rows = max_rows
        self._inputs: dict[tuple[int, int], StepInputs] = {}
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._stamp: tuple[int, int] = (-1, -1)  # (cache, adapter) generations of the graphs
        self._pool = None
        self.captures = 0
        self.replays = 0
        self.eager_steps = 0
        self.error = ""  # why graphs were turned off (GET /stats shows it)
        # unseeded rows sample from this generator, not torch's default one, which a capture
        # that fails can leave unusable (every later sample raises)
        self.rng: torch.Generator | None = None
        if capture:
            self.rng = torch.Generator(device=self.device)
            self.rng.seed()

    def new_cache(self) -> StaticCache:
        """The (one) arena, emptied, for a new running batch."""
        return self.cache.reset()

    def step(self, adapters: list[str | None], ids: torch.Tensor, mask: torch.Tensor,
             positions: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] (float32) of one decode step; advances the cache by one."""
        cache = self.cache
        rows, width = mask.shape
        cache.ensure_capacity(width)
        shape = (bucket(rows, 1, self.max_rows), bucket(width, _MIN_POSITIONS, cache.capacity))
        inputs = self._inputs.get(shape)
        if inputs is None:
            inputs = self._inputs[shape] = StepInputs.allocate(*shape, self.vocab, self.device)
        inputs.fill(ids, mask, positions)
        cache.view, cache.write_index = shape, inputs.write_index
        padded = adapters + [adapters[0]] * (shape[0] - rows)
        if self.capture and len(set(adapters)) == 1:
            self._replay(shape, padded, inputs)
        else:
            self.eager_steps += 1
            self._run(padded, inputs)
        cache.length = width
        return inputs.logits[:rows]

    def _run(self, adapters: list[str | None], inputs: StepInputs) -> None:
        out = self.lora.forward(
            adapters,
            input_ids=inputs.ids,
            attention_mask=inputs.mask,
            position_ids=inputs.positions,
            cache=self.cache,
            use_cache=True,
        )
        inputs.logits.copy_(out.logits[:, -1, :])

    def _replay(self, shape: tuple[int, int], adapters: list[str | None],
                inputs: StepInputs) -> None:
        stamp = (self.cache.generation, self.lora.generation)
        if stamp != self._stamp:  # arenas moved or adapters changed: every graph is stale
            # and so is their memory pool: once its last graph is gone torch releases it, and
            # capturing into the released pool's handle fails inside the caching allocator
            # ("use_count > 0" assertion, seen on an H200, 2026-11-28)
            self._graphs.clear()
            self._pool = None
            self._stamp = stamp
        key = (*shape, adapters[0])
        graph = self._graphs.get(key)
        if graph is None:
            try:
                graph = self._graphs[key] = self._capture(adapters, inputs)
            except Exception as exc:  # a forward that cannot be captured: decode eagerly
                log.warning("could not capture a CUDA graph of a decode step; decoding "
                            "without graphs from now on", exc_info=True)
                self.capture = False
                self.error = f"{type(exc).__name__}: {exc}"[:500]
                self.eager_steps += 1
                self._run(adapters, inputs)
                return
        graph.replay()
        self.replays += 1

    def _capture(self, adapters: list[str | None], inputs: StepInputs) -> Any:
        """Warm up on a side stream (library handles), then capture one step.

        Both runs write this step's keys/values at this step's position, the same values the
        replay that follows writes again, so capturing changes nothing a request can see.
        """
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._run(adapters, inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of the server's other threads cannot invalidate the capture
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._run(adapters, inputs)
        self.captures += 1
        log.debug("captured a decode graph for %s rows x %s positions (%s)",
                  inputs.ids.shape[0], inputs.mask.shape[-1], adapters[0] or "base")
        return graph
