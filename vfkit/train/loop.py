"""vf-train's loop: RL on a LoRA adapter, each batch sampled `async_level` policies behind.

    sample batch s+async_level (today's policy) -> take batch s -> advantages -> samples
    -> loss, backward, step -> save adapter -> hot-load + verify it -> eval / checkpoint

How this departs from GRPO (Shao et al. 2024, arXiv:2402.03300):
- LoRA only (PEFT); the server hot-loads each step's adapter instead of syncing full weights.
- One gradient step per batch, as decoupled PPO (`ratio_against = "trainer"`, the default):
  the clip is measured from the trainer's own pre-update logprobs (so it never fires; with
  `num_iterations` > 1 the batch's later steps are clipped from its first policy), and
  each token is weighted by trainer/sampler, which corrects both the async lag (batch s comes
  from policy s-1-async_level) and the numeric mismatch between server and trainer; tokens
  whose weight leaves [mask_ratio_low, mask_ratio_high] are masked out of the loss (losses/,
  update.py). `ratio_against = "sampler"` measures the clip from the sampler instead: a trust
  region across the lag (benchmarks/RESULTS.md, "The decoupled ratio").
- KL to the base model is optional (beta, default 0), computed by disabling the adapter.
- Groups whose rewards are all equal teach nothing and are dropped (`filter_zero_advantage`);
  dynamic sampling (DAPO, `dynamic_sampling_rounds`, off by default) samples fresh prompts in
  their place before the batch reaches the loop.

Batches come from a `BatchSource` (batches.py): live sampling through the inference server, or
the rollouts files of an earlier `--phase rollout` (then nothing is published or evaluated).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vfkit.errors import VfkitError
from vfkit.train.advantages import assign_advantages
from vfkit.train.batches import Batch, BatchSource
from vfkit.train.config import TrainerArgs
from vfkit.train.learner import Learner
from vfkit.train.metrics import MetricsLogger, StallWatch, note_failures, rollout_metrics
from vfkit.train.samples import build_samples, nothing_to_train


@dataclass
class StopFlag:
    """Set by the first SIGINT/SIGTERM: finish the current step, checkpoint, exit cleanly."""

    requested: bool = False

    def __call__(self) -> bool:
        return self.requested


@dataclass
class LoopState:
    """Where the run is: batches trained (= the newest policy version), last checkpoint."""

    step: int = 0
    saved: int = 0


def run_loop(
    source: BatchSource, learner: Learner, log: MetricsLogger, args: TrainerArgs,
    state: LoopState, stop: StopFlag,
) -> None:
    """Train from `state.step` (0 = fresh) to max_steps, or until `stop` is set."""
    learner.share_cores_with(source.generating)  # CPU: every core while nothing generates
    stall = StallWatch(log.console)  # warns when steps in a row carry no learning signal
    if start_metrics := source.start(state.step):  # queue the first batches; eval at step 0
        log.log(state.step, start_metrics)
    while state.step < args.max_steps and not stop():
        # the off-policy lag: batch s+async_level is sampled by today's policy while we train
        # on batch s (async_level = 0: it is batch s itself, and we wait for it right here)
        source.submit(state.step + 1 + args.async_level)
        batch = source.get(state.step + 1, stop)
        if batch is None:  # stop requested while waiting: checkpoint the last full step
            break
        state.step = batch.step
        metrics = train_on(batch, learner, args)
        note_failures(log.console, state.step, batch.groups)
        stall.see(state.step, batch.groups)
        metrics |= source.publish(state.step, learner.save_adapter(state.step), learner)
        evaluate = args.eval_steps and (
            state.step % args.eval_steps == 0 or state.step == args.max_steps)
        metrics |= source.finish(batch, evaluate=bool(evaluate))  # rollouts file, eval
        log.log(state.step, metrics)
        if args.save_steps and state.step % args.save_steps == 0:
            checkpoint(source, learner, state)
    if state.step > state.saved:  # the end of the run, or a stop request
        checkpoint(source, learner, state)


def train_on(batch: Batch, learner: Learner, args: TrainerArgs) -> dict[str, float]:
    """Advantages -> samples -> the batch's optimizer step(s); the step's metrics."""
    if why := nothing_to_train(batch.groups):  # a broken setup, not a bad batch: stop loudly
        raise VfkitError(f"step {batch.step} trained nothing: {why}")
    kept, groups = assign_advantages(
        batch.groups, scale_rewards=args.scale_rewards,
        zero_truncated=args.zero_truncated_completions, filter_zero=args.filter_zero_advantage,
    )
    samples, counts = build_samples(
        kept, max_seq_len=args.max_seq_len, mask_truncated=args.mask_truncated_completions,
        images=getattr(learner, "images", None),  # a VLM policy's image processor
    )
    started = time.monotonic()
    metrics = learner.update(samples)
    train_s = time.monotonic() - started
    tokens = sum(len(s) for s in samples)
    return {
        **rollout_metrics(batch.groups, kept),
        **metrics,
        "groups/kept": groups.kept,
        "groups/filtered": groups.filtered,
        "groups/failed": groups.failed,
        "groups/resampled": len(batch.groups) - args.prompts_per_batch,  # dynamic sampling
        "samples/trained": len(samples),
        "samples/too_long": counts.too_long,
        "samples/truncated_masked": counts.truncated_masked,
        "samples/no_tokens": counts.no_tokens,
        "samples/bad_images": counts.bad_images,
        "tokens/total": tokens,
        "tokens/loss": sum(s.num_loss_tokens for s in samples),
        "time/train": train_s,
        "tokens_per_s": tokens / max(train_s, 1e-9),
        "policy/version": batch.policy_version,
        "policy/lag": batch.step - 1 - batch.policy_version,
        "time/generate": batch.generate_s,
        "time/wait": batch.wait_s,
    }


def checkpoint(source: BatchSource, learner: Learner, state: LoopState) -> None:
    """checkpoints/step_<step>, with the older adapters queued batches still sample from."""
    learner.save_checkpoint(state.step, checkpoint_state(state.step, learner.args.async_level),
                            source.policies_in_use(state.step))
    state.saved = state.step


def checkpoint_state(step: int, async_level: int) -> dict[str, int]:
    """What state.json records beside the weights: the next step is the data cursor."""
    return {"policy_version": step, "data_cursor": step + 1, "async_level": async_level}
