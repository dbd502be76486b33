"""Samples -> padded micro-batches, bucketed by length so padding stays small.

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

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask_BT.sum())

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same tensors on `device` (the model's: the loss never mixes devices)."""
        fields = {k: v for k, v in vars(self).items() if k != "vision"}
        return MicroBatch(
            **{k: v.to(device, non_blocking=True) for k, v in fields.items()},
            vision={k: v.to(device, non_blocking=True) for k, v in self.vision.items()},
        )


def bucket_by_length(samples: list[Sample], micro_batch_size: int) -> list[list[Sample]]:
    """Chunks of `micro_batch_size` samples of similar length (longest first, stable order)."""
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i]), i))
    ordered = [samples[i] for i in order]
    return [ordered[i : i + micro_batch_size] for i in range(0, len(ordered), micro_batch_size)]


def collate(samples: list[Sample], pad_id: int, images: ImageInputs | None = None) -> MicroBatch:
    """Pad a list of samples on the right to the longest one (with their vision inputs)."""
    width = max(len(s) for s in samples)

    def pad(rows: list[list], value: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype)

    input_ids_BT = pad([s.input_ids for s in samples], pad_id, torch.long)
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
    )


def micro_batches(
    samples: list[Sample], micro_batch_size: int, pad_id: int, *, rank: int = 0, world: int = 1,
    device: torch.device | str = "cpu", images: ImageInputs | None = None,
) -> list[MicroBatch]:
    """This process's share of the step's micro-batches on `device` (same count on every rank).

    `images`: the VLM policy's image processor (collates the samples' vision inputs)."""
    buckets = bucket_by_length(samples, micro_batch_size)
    while len(buckets) % world:  # DDP needs equal backward counts: repeat with zero loss mask
        buckets.append([_without_loss(s) for s in buckets[-1]])
    return [collate(b, pad_id, images).to(device) for b in buckets[rank::world]]


def _without_loss(sample: Sample) -> Sample:
    return Sample(sample.input_ids, [0] * len(sample), sample.sampling_logprobs, 0.0,
                  images=sample.images, vision=sample.vision)
