"""Continuous batching: one worker thread decodes every running sequence together.

Each loop iteration: run pending adapter operations, admit waiting sequences (prefill them as a
left-padded group; an image prompt's n samples form a group of their own, see vision.py; then
write them into free slots of the running batch, see batch.py), decode one token for every
row (text and image prompts alike), retire finished rows. A request arriving mid-generation
therefore joins at the next step instead of waiting for the whole batch. The waiting queue is
bounded (429 beyond it); whatever ends the worker, every pending request gets an answer.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from vfkit.serve.batch import RunningBatch
from vfkit.serve.engine_stats import EngineStats
from vfkit.serve.errors import APIError
from vfkit.serve.graphs import StaticDecoder
from vfkit.serve.kv_cache import BatchCache
from vfkit.serve.lora import LoraManager
from vfkit.serve.prefill import plan_prefill, prompt_key
from vfkit.serve.sampling import RowInput, StepOutput, sample_step
from vfkit.serve.sequence import SamplingParams, Sequence
from vfkit.serve.vision import VisionPrefill

log = logging.getLogger("vfkit.serve")
_MAX_GATHER_S = 0.25  # longest an arrival waits for others before its prefill


class Engine:
    """Owns the model; `submit` sequences from any thread, get them back through `on_done`."""

    def __init__(
        self,
        lora: LoraManager,
        tokenizer: Any,
        *,
        max_model_len: int,
        eos_token_ids: set[int],
        max_batch: int = 32,
        max_queue: int = 256,
        max_prefill_tokens: int = 4096,
        max_loras: int = 4,
        threads: int | None = None,
        model_path: str = "",
        processor: Any = None,
        static_decode: bool = False,
        capture_graphs: bool | None = None,
    ) -> None:
        self.lora = lora
        self.processor = processor  # an image-text-to-text model's processor (None: text-only)
        self.vision = VisionPrefill(lora.model)  # used by prompts that carry images
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.max_prefill_tokens = max_prefill_tokens
        self.max_loras = max_loras
        self.threads = threads
        self.device = next(lora.model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._ops: collections.deque[_Op] = collections.deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # decode steps over a fixed-address cache, replayed as CUDA graphs (graphs.py); with
        # capture_graphs=False the same static steps run eagerly (how CPU tests check them)
        self.decoder: StaticDecoder | None = None
        if static_decode:
            capture = self.device.type == "cuda" if capture_graphs is None else capture_graphs
            self.decoder = StaticDecoder(
                lora, max_rows=max_batch, max_length=max_model_len + 1, capture=capture
            )
        self._batch = self._new_batch()
        self.stats = EngineStats()
        self._step_s = 0.0

    # ---- any thread ----
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="vfkit-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, seqs: list[Sequence]) -> None:
        """Queue sequences for generation; 429 when the waiting queue is full."""
        if len(seqs) > self.max_queue:
            raise APIError(
                400,
                f"The request needs {len(seqs)} sequences (prompts x n) but the server queues "
                f"at most {self.max_queue}; split it or restart with a larger --max-queue.",
                param="n",
            )
        with self._wake:
            if self._stopping or not self.alive:
                raise APIError(503, "The generation worker is not running; see the server log.")
            if len(self._waiting) + len(seqs) > self.max_queue:
                raise APIError(
                    429,
                    f"The server is busy ({len(self._waiting)} sequences waiting, limit "
                    f"{self.max_queue}). Retry later.",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": "1"},
                )
            now = time.monotonic()
            for seq in seqs:
                seq.queued_at = now
            self._waiting.extend(seqs)
            self._wake.notify()

    def call(self, fn: Callable[[], Any], *, unused_adapter: str | None = None) -> Future:
        """Run `fn` on the worker between two decode steps (adapter changes touch the model).

        Operations run in order; with `unused_adapter`, this one (and those after it) waits
        until no running or waiting sequence uses that adapter.
        """
        future: Future = Future()
        with self._wake:
            self._ops.append(_Op(fn, future, unused_adapter))
            self._wake.notify()
        return future

    def uses_adapter(self, name: str) -> bool:
        with self._wake:
            return any(s.adapter == name for s in (*self._batch.rows, *self._waiting))

    @property
    def steps(self) -> int:
        return self.stats.decode_steps

    def generator(self, seed: int | None, index: int) -> torch.Generator | None:
        """The random source of sample `index` of a seeded request (None: the global one).

        A CPU generator on every device: a seed draws the same uniforms on a CPU and a GPU
        server, and a step's seeded draws cost no kernel launches (sampling.py gathers them).
        """
        if seed is None:
            return None
        # wrapped into torch's 64-bit seed range (seed is validated as a signed 64-bit int)
        return torch.Generator().manual_seed((seed + index) % 2**64)

    def load(self) -> dict[str, int]:
        """Queue and batch sizes, for /health and logs."""
        return {"waiting": len(self._waiting), "running": len(self._batch.rows)}

    # ---- worker thread ----
    def _loop(self) -> None:
        """Run until stopped; whatever ends the loop, no request is left waiting forever."""
        reason: BaseException = RuntimeError("the server is stopping")
        try:
            self._serve()
        except BaseException as exc:
            log.exception("the generation worker died")
            reason = exc
        finally:
            with self._wake:
                self._stopping = True
                pending = [*self._batch.rows, *self._waiting]
                self._waiting.clear()
                ops = list(self._ops)
                self._ops.clear()
            self._fail(pending, reason)
            for op in ops:
                op.future.set_exception(RuntimeError(f"generation worker stopped: {reason!r}"))

    def _serve(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            while True:
                with self._wake:
                    while not (self._stopping or self._ops or self._waiting or self._batch.rows):
                        self._wake.wait()
                    if self._stopping:
                        return
                start = time.perf_counter()
                self._run_ops()
                self._admit()
                if self._batch.rows:
                    self._guarded(self._decode, self._batch.rows)
                self.stats.busy_s += time.perf_counter() - start

    def _run_ops(self) -> None:
        while self._ops:
            op = self._ops[0]
            if op.unused_adapter is not None and self.uses_adapter(op.unused_adapter):
                return
            self._ops.popleft()
            try:
                op.future.set_result(op.fn())
            except BaseException as exc:  # handed to the waiting HTTP handler
                op.future.set_exception(exc)

    def _guarded(self, step: Callable[[], None], rows: list[Sequence]) -> None:
        """Run a step; if it raises, fail its rows and the running batch, and start afresh.

        An Exception costs only those requests; anything else (SystemExit, ...) also ends the
        worker, after the requests it touched have been answered.
        """
        try:
            step()
        except BaseException as exc:
            log.exception("generation step failed")
            self._fail([*rows, *(s for s in self._batch.rows if s not in rows)], exc)
            self._batch = self._new_batch()
            if not isinstance(exc, Exception):
                raise

    def _new_batch(self) -> RunningBatch:
        # dead rows cost a CPU step per row, a GPU step next to nothing (batch.py)
        compact_at = 0.125 if self.device.type == "cpu" else 0.5
        new_cache = self.decoder.new_cache if self.decoder else None
        return RunningBatch(new_cache=new_cache, compact_at=compact_at)

    def _admit(self) -> None:
        """Move waiting sequences into the batch, within batch, prefill and adapter limits."""
        if not self._admission_due():
            return
        new: list[Sequence] = []
        adapters = {s.adapter for s in self._batch.rows}
        longest, prompts = 0, set()  # the forward runs each distinct prompt once (prefill.py)
        with self._wake:
            while self._waiting and len(self._batch.rows) + len(new) < self.max_batch:
                seq = self._waiting[0]
                if seq.aborted:
                    self._waiting.popleft()
                    continue
                if new and seq.vision is not new[0].vision:
                    break  # an image prompt (its n samples) is prefilled on its own
                longest_after = max(longest, len(seq.prompt_ids))
                prompts_after = prompts | {prompt_key(seq)}
                if new and longest_after * len(prompts_after) > self.max_prefill_tokens:
                    break
                if seq.adapter not in adapters and len(adapters - {None}) >= self.max_loras:
                    break
                adapters.add(seq.adapter)
                longest, prompts = longest_after, prompts_after
                new.append(self._waiting.popleft())
        if new:
            self._guarded(lambda: self._prefill(new), new)

    def _admission_due(self) -> bool:
        """Prefill now, or let a burst of arrivals gather into one prefill?

        A prefill stalls every running row and costs about as much for one prompt as for
        several (the weights are read once), so while rows are decoding, a few arrivals wait
        up to ~2 decode steps for company unless they already fill the free slots.
        """
        if not self._waiting or not self._batch.rows:
            return bool(self._waiting)
        if len(self._waiting) >= self.max_batch - len(self._batch.rows):
            return True
        window = min(_MAX_GATHER_S, 2 * self._step_s)
        return time.monotonic() - self._waiting[0].queued_at >= window

    def _prefill(self, new: list[Sequence]) -> None:
        plan = plan_prefill(new, self.pad_id)  # each distinct prompt once (prefill.py)
        ids, mask = plan.ids, plan.mask
        positions, next_positions, vision = plan.positions, plan.next_positions(), {}
        if new[0].vision is not None:  # copies of one prompt (see _admit): no padding
            positions, next_positions = self.vision.positions(new[0].vision, ids, mask)
            vision = self.vision.forward_inputs(new[0].vision, copies=len(plan.distinct))
        cache = BatchCache()
        start = time.perf_counter()
        adapters = [s.adapter for s in plan.distinct]
        logits = self._forward(adapters, ids, mask, positions, cache, **vision)
        logits, mask, next_positions = plan.expand(cache, logits, mask, next_positions)
        for seq in new:
            seq.vision = None  # in the KV cache now: the pixels need not live while it decodes
        self.stats.prefill_s += time.perf_counter() - start
        self.stats.prefill_tokens += int(plan.mask.sum())
        self.stats.prefill_shared += plan.shared
        self.stats.prefills += 1
        self.stats.admitted += len(new)
        now = time.monotonic()
        self.stats.queue_wait_s += sum(now - s.queued_at for s in new)
        out = self._sample(logits, new)
        self._batch.add(
            RunningBatch(list(new), cache, mask, next_positions, torch.tensor(out.tokens))
        )
        self._record(new, out)

    def _decode(self) -> None:
        b = self._batch
        ids, mask, positions = b.step_inputs()
        start = time.perf_counter()
        if self.decoder is not None and b.cache is self.decoder.cache:
            logits = self.decoder.step(b.adapters(), ids, mask, positions)
            self.stats.graph_replays = self.decoder.replays
            self.stats.graph_captures = self.decoder.captures
        else:
            logits = self._forward(b.adapters(), ids, mask, positions, b.cache)
        elapsed = time.perf_counter() - start
        self._step_s = 0.9 * self._step_s + 0.1 * elapsed  # moving average of a decode step
        live = b.live()
        rows = [b.slots[i] for i in live]
        self.stats.decode_s += elapsed
        self.stats.decode_steps += 1
        self.stats.decode_rows += len(rows)
        self.stats.decode_slots += len(b.slots)
        out = self._sample(logits[live] if len(live) < len(b.slots) else logits, rows)
        b.advance(live, out.tokens)
        self._record(rows, out)

    def _sample(self, logits: torch.Tensor, rows: list[Sequence]) -> StepOutput:
        start = time.perf_counter()
        inputs = [RowInput(s.params, s.generator, s.prompt_ids, s.output_ids) for s in rows]
        out = sample_step(logits, inputs, self.decoder.rng if self.decoder else None)
        self.stats.sample_s += time.perf_counter() - start
        return out

    def _forward(self, adapters, ids, mask, positions, cache, **vision) -> torch.Tensor:
        """Last-position logits; `vision`: an image prompt's tensors (VisionPrefill)."""
        dev = self.device
        out = self.lora.forward(
            adapters,
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            cache=cache,
            use_cache=True,
            # an index tensor, not `1`: a strided last-position slice sends the lm_head through
            # a batched matmul that copies its weight once per row (seconds for 32 prompts)
            logits_to_keep=torch.tensor([ids.shape[1] - 1], device=dev),
            **vision,
        )
        return out.logits[:, -1, :].float()

    def _record(self, rows: list[Sequence], out: StepOutput) -> None:
        """Append each row's new token, decide which rows are done, retire them."""
        for seq, token, logprob, top in zip(rows, out.tokens, out.logprobs, out.top, strict=True):
            seq.output_ids.append(token)
            if seq.params.logprobs is not None:
                seq.logprobs.append(logprob)
                seq.top_logprobs.append(top)
            self._check_finished(seq, token)
            if seq.on_token is not None:  # after the check: the last token carries the finish
                wanted = seq.params.logprobs is not None
                seq.on_token(seq, token, logprob if wanted else None, top if wanted else None)
        self._batch.retire(lambda s: s.finish_reason is not None or s.aborted, self._done)

    def _check_finished(self, seq: Sequence, token: int) -> None:
        p = seq.params
        if token in p.stop_token_ids or (token in self.eos_token_ids and not p.ignore_eos):
            seq.finish_reason = "stop"
            seq.text = self._decode_text(seq.output_ids[:-1], p)
            return
        if p.stop:
            text = self._decode_text(seq.output_ids, p)
            hits = [i for i in (text.find(s) for s in p.stop) if i >= 0]
            if hits:
                seq.finish_reason, seq.text = "stop", text[: min(hits)]
                return
        total = len(seq.prompt_ids) + len(seq.output_ids)
        if len(seq.output_ids) >= p.max_tokens or total >= self.max_model_len:
            seq.finish_reason = "length"
            seq.text = self._decode_text(seq.output_ids, p)

    def _decode_text(self, ids: list[int], p: SamplingParams) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)

    def _done(self, seq: Sequence) -> None:
        if seq.aborted:
            self.stats.aborted += 1
        else:
            self.stats.finished += 1
        if seq.on_done is not None:
            seq.on_done(seq)

    def _fail(self, rows: list[Sequence], exc: BaseException) -> None:
        for seq in rows:
            if seq.finish_reason is None:
                seq.error = exc
                self._done(seq)


@dataclass
class _Op:
    fn: Callable[[], Any]
    future: Future
    unused_adapter: str | None = None
