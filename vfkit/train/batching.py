"""Samples -> padded micro-batches, bucketed by length so padding stays small.

Rows of one prompt (a group) share their first tokens. The learner runs them once a step for
all micro-batches (`step_prompts`, `MicroBatch.step_group_B`; policy.StepPrefix), or, where
that does not apply, once a group in each micro-batch (`MicroBatch.shared_prefix`, `group_B`;
policy.token_logprobs). Bucketing by prompt instead (one group a micro-batch) pads each group's
completions to its longest: no faster on exp.toml's batch (RESULTS.md, "A group's prompt runs
once").

A vision-language policy's micro-batch also carries its samples' vision inputs (`vision`:
pixel_values, image_sizes / image_grid_thw, ...), on the same device as the ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vfkit.train.samples import Sample
from vfkit.train.vision import ImageInputs


@dataclass
class MicroBatch:
    """Right-padded tensors for one forward/backward pass (B sequences × T tokens)."""

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor  # float, 1 on trained tokens
    sampling_logprobs_BT: torch.Tensor
    advantages_B: torch.Tensor
    vision: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's image inputs
    shared_prefix: int = 0  # leading tokens each row shares with the others of its group,
    group_B: torch.Tensor | None = None  # ... and each row's group (rows with the same prompt)
    step_group_B: torch.Tensor | None = None  # each row's prompt in the step's StepPrompts

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask_BT.sum())

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same tensors on `device` (the model's: the loss never mixes devices)."""
        fields = {k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return MicroBatch(
            **{k: v.to(device, non_blocking=True) for k, v in fields.items()},
            vision={k: v.to(device, non_blocking=True) for k, v in self.vision.items()},
            shared_prefix=self.shared_prefix,
        )  # group_B is a tensor: moved with the others


@dataclass
class StepPrompts:
    """The step's distinct prompts, for one forward a step (policy.StepPrefix): the first P
    tokens of each, which all its rows share and before which no row's loss reads a logit."""

    ids_GP: torch.Tensor
    index: dict[tuple[int, ...], int]  # prompt_of(sample) -> its row in ids_GP


def step_prompts(samples: list[Sample]) -> StepPrompts | None:
    """The step's StepPrompts, or None where no prompt comes twice or nothing can be shared."""
    index: dict[tuple[int, ...], int] = {}
    members: list[list[list[int]]] = []
    for s in samples:
        if index.setdefault(prompt_of(s), len(index)) == len(members):
            members.append([])
        members[index[prompt_of(s)]].append(s.input_ids)
    if len(members) == len(samples):
        return None
    first_read = min(_first_trained(s) for s in samples) - 1  # its logits predict a trained token
    length = min(first_read, *(common_prefix(m) for m in members))
    if length <= 0:
        return None
    return StepPrompts(torch.tensor([m[0][:length] for m in members]), index)


def bucket_by_length(samples: list[Sample], micro_batch_size: int) -> list[list[Sample]]:
    """Chunks of `micro_batch_size` samples of similar length (longest first, stable order)."""
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i]), i))
    ordered = [samples[i] for i in order]
    return [ordered[i : i + micro_batch_size] for i in range(0, len(ordered), micro_batch_size)]


def shared_prefixes(rows: list[Sample]) -> tuple[int, list[int]]:
    """(P, group of each row): rows with the same prompt form a group, and each group's rows
    share their first P tokens (P the shortest of the groups' common prefixes)."""
    keys: dict[tuple[int, ...], int] = {}
    group_B = [keys.setdefault(prompt_of(s), len(keys)) for s in rows]
    members = [[s.input_ids for s, g in zip(rows, group_B, strict=True) if g == k]
               for k in range(len(keys))]
    return min(common_prefix(m) for m in members), group_B


def common_prefix(rows: list[list[int]]) -> int:
    """How many leading tokens all `rows` share."""
    shortest = min(len(r) for r in rows)
    return next((i for i in range(shortest) if any(r[i] != rows[0][i] for r in rows)), shortest)


def prompt_of(sample: Sample) -> tuple[int, ...]:
    """The tokens before the first trained one."""
    return tuple(sample.input_ids[: _first_trained(sample)])


def _first_trained(sample: Sample) -> int:
    return next((i for i, m in enumerate(sample.loss_mask) if m), len(sample))


def collate(
    samples: list[Sample], pad_id: int, images: ImageInputs | None = None,
    prompts: StepPrompts | None = None,
) -> MicroBatch:
    """Pad a list of samples on the right to the longest one (with their vision inputs)."""
    width = max(len(s) for s in samples)

    def pad(rows: list[list], value: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype)

    input_ids_BT = pad([s.input_ids for s in samples], pad_id, torch.long)
    prefix, group_B = shared_prefixes(samples)
    vision = {}
    if images is not None and any(s.vision for s in samples):
        vision = images.collate([s.vision for s in samples]) | images.token_inputs(input_ids_BT)
    return MicroBatch(
        input_ids_BT=input_ids_BT,
        attention_mask_BT=pad([[1] * len(s) for s in samples], 0, torch.long),
        loss_mask_BT=pad([s.loss_mask for s in samples], 0, torch.float32),
        sampling_logprobs_BT=pad([s.sampling_logprobs for s in samples], 0.0, torch.float32),
        advantages_B=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        vision=vision,
        shared_prefix=prefix, group_B=torch.tensor(group_B),
        step_group_B=None if prompts is None else
        torch.tensor([prompts.index[prompt_of(s)] for s in samples]),
    )  # fmt: skip


def micro_batches(
    samples: list[Sample], micro_batch_size: int, pad_id: int, *, rank: int = 0, world: int = 1,
    device: torch.device | str = "cpu", images: ImageInputs | None = None,
    prompts: StepPrompts | None = None,
) -> list[MicroBatch]:
    """This process's share of the step's micro-batches on `device` (same count on every rank).

    `images`: the VLM policy's image processor (collates the samples' vision inputs).
    `prompts`: the step's prompts (`step_prompts`), to mark each row's (`step_group_B`)."""
    buckets = bucket_by_length(samples, micro_batch_size)
    while len(buckets) % world:  # DDP needs equal backward counts: repeat with zero loss mask
        buckets.append([_without_loss(s) for s in buckets[-1]])
    return [collate(b, pad_id, images, prompts).to(device) for b in buckets[rank::world]]


def _without_loss(sample: Sample) -> Sample:
    return Sample(sample.input_ids, [0] * len(sample), sample.sampling_logprobs, 0.0,
                  images=sample.images, vision=sample.vision)
