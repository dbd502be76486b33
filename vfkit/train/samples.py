"""Rollout states -> training samples, from the server's token ids (never re-tokenized text).

A rollout becomes one sequence when each turn's prompt extends the previous turn's prompt +
completion (the usual chat case), else one sequence per turn. Prompt and environment/tool tokens
get loss mask 0; sampled tokens keep the server's completion_mask and sampling logprobs.

Images: a sequence carries the image URLs of its last turn's prompt (the images its ids hold,
as expanded placeholder tokens, in prompt order). A vision-language policy turns them into the
processor's tensors here (`build_samples(images=...)`); a sample whose placeholder count does
not match its images is dropped and counted, and no image token is ever in the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vfkit.client.limits import SequenceLimits
from vfkit.images import ImageError, message_image_urls
from vfkit.train.vision import ImageInputs
from vfkit.types import State


@dataclass
class Sample:
    """One training sequence; per-token lists are aligned with `input_ids`."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 = a token the policy sampled and the loss trains on
    sampling_logprobs: list[float]  # the sampler's logprob of each token (0 where masked)
    advantage: float
    is_truncated: bool = False
    images: list[str] = field(default_factory=list)  # image URLs of the sequence, prompt order
    vision: dict[str, Any] = field(default_factory=dict)  # the processor's tensors for `images`

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class SampleCounts:
    """Rollouts and sequences left out of the loss, by reason (logged every step)."""

    errors: int = 0  # rollouts with state["error"]
    no_tokens: int = 0  # the server sent no token ids for a turn
    truncated_masked: int = 0  # truncated and mask_truncated_completions is on
    too_long: int = 0  # over max_seq_len: dropped, never silently cut
    # image placeholders that do not match the images (a corrupt rollout, or a completion that
    # sampled the image token itself: the forward could not place it), or unreadable images
    bad_images: int = 0


def step_image_urls(state: State, step: dict[str, Any]) -> list[str]:
    """The image URLs of one trajectory step's prompt: from its messages (a live rollout) or
    from the rollout record's image table (rollouts/step_N.jsonl, see data.state_record)."""
    if "image_refs" in step:
        return [state["images"][i] for i in step["image_refs"]]
    prompt = step.get("prompt")
    return message_image_urls(prompt) if isinstance(prompt, list) else []


def rollout_samples(state: State) -> list[Sample] | None:
    """The sequences of one rollout (None when a turn has no token ids)."""
    samples: list[Sample] = []
    current: Sample | None = None
    for step in state.get("trajectory") or []:
        tokens = step.get("tokens")
        if tokens is None:
            return None
        if tokens.get("overlong_prompt") or not tokens["completion_ids"]:
            continue
        prompt_ids = list(tokens["prompt_ids"])
        if current is None or prompt_ids[: len(current)] != current.input_ids:
            current = Sample([], [], [], float(state.get("advantage") or 0.0))
            samples.append(current)
        new_context = prompt_ids[len(current) :]  # env/tool tokens between turns: not trained
        current.input_ids += new_context + list(tokens["completion_ids"])
        current.loss_mask += [0] * len(new_context) + list(tokens["completion_mask"])
        current.sampling_logprobs += [0.0] * len(new_context) + list(tokens["completion_logprobs"])
        current.is_truncated = current.is_truncated or bool(tokens.get("is_truncated"))
        current.images = step_image_urls(state, step)  # this turn's prompt holds them all
    if state.get("is_truncated") and samples:
        samples[-1].is_truncated = True
    return samples


def attach_images(sample: Sample, images: ImageInputs | None) -> bool:
    """Give a sample its vision inputs and take every image token out of the loss; False when
    the ids' placeholders do not match the images (a corrupt rollout: not trainable)."""
    if images is None:  # a text-only policy: a sample with images is not one it can train
        return not sample.images
    image_token = images.image_token_id
    placeholders = sample.input_ids.count(image_token)
    if not sample.images and not placeholders:  # a text-only sample
        return True
    try:
        encoded = images.encode(sample.images)
    except ImageError:
        return False
    if encoded.num_tokens != placeholders:
        return False
    sample.vision = encoded.tensors
    # image placeholders are prompt tokens, never sampled: guard the mask all the same
    sample.loss_mask = [0 if t == image_token else m
                        for t, m in zip(sample.input_ids, sample.loss_mask, strict=True)]
    return True


def build_samples(
    groups: list[list[State]], *, max_seq_len: int, mask_truncated: bool,
    images: ImageInputs | None = None,
) -> tuple[list[Sample], SampleCounts]:
    """All trainable samples of a step's kept groups, and counts of what was left out.

    `images`: the policy's image processor (vision-language models), None for text models.
    """
    counts = SampleCounts()
    out: list[Sample] = []
    for state in (s for group in groups for s in group):
        if state.get("error"):
            counts.errors += 1
            continue
        samples = rollout_samples(state)
        if samples is None:
            counts.no_tokens += 1
            continue
        for sample in samples:
            if mask_truncated and sample.is_truncated:
                counts.truncated_masked += 1
            elif not SequenceLimits(max_seq_len).sequence_fits(len(sample)):
                counts.too_long += 1
            elif not sample.num_loss_tokens:
                continue
            elif not attach_images(sample, images):
                counts.bad_images += 1
            elif sample.num_loss_tokens:
                out.append(sample)
    return out, counts


def nothing_to_train(groups: list[list[State]]) -> str | None:
    """Why no rollout of a batch can train, and what to do (every one failed, or none produced
    a completion token, e.g. every prompt too long for the context); None when one can."""
    reasons: dict[str, int] = {}
    first_error = ""
    for state in (s for group in groups for s in group):
        if not state.get("error") and any(
            (step.get("tokens") or {}).get("completion_ids")
            for step in state.get("trajectory") or []
        ):
            return None
        reason = "error" if state.get("error") else str(state.get("stop_condition") or "empty")
        reasons[reason] = reasons.get(reason, 0) + 1
        first_error = first_error or str(state.get("error") or "")
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items())) or "no rollouts"
    if not first_error:
        return (f"no rollout produced a completion token ({why}); check trainer.args.max_tokens "
                "against the model's context and max_seq_len, and the server log")
    if "reward function" in first_error:
        fix = "fix the environment's reward function (rollouts/step_N.jsonl shows each error)"
    else:
        fix = "see the server log (logs/server.log) and the rollouts' errors"
    return f"every rollout failed ({why}; first error: {first_error[:300]}); {fix}"
