"""Samples -> padded micro-batches, bucketed by length so padding stays small."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vfkit.train.samples import Sample


@dataclass
class MicroBatch:
    """Right-padded tensors for one forward/backward pass (B sequences × T tokens)."""

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor  # float, 1 on trained tokens
    sampling_logprobs_BT: torch.Tensor
    advantages_B: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask_BT.sum())

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same tensors on `device` (the model's: the loss never mixes devices)."""
        return MicroBatch(**{k: v.to(device, non_blocking=True) for k, v in vars(self).items()})


def bucket_by_length(samples: list[Sample], micro_batch_size: int) -> list[list[Sample]]:
    """Chunks of `micro_batch_size` samples of similar length (longest first, stable order)."""
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i]), i))
    ordered = [samples[i] for i in order]
    return [ordered[i : i + micro_batch_size] for i in range(0, len(ordered), micro_batch_size)]


def collate(samples: list[Sample], pad_id: int) -> MicroBatch:
    """Pad a list of samples on the right to the longest one."""
    width = max(len(s) for s in samples)

    def pad(rows: list[list], value: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype)

    return MicroBatch(
        input_ids_BT=pad([s.input_ids for s in samples], pad_id, torch.long),
        attention_mask_BT=pad([[1] * len(s) for s in samples], 0, torch.long),
        loss_mask_BT=pad([s.loss_mask for s in samples], 0, torch.float32),
        sampling_logprobs_BT=pad([s.sampling_logprobs for s in samples], 0.0, torch.float32),
        advantages_B=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
    )


def micro_batches(
    samples: list[Sample], micro_batch_size: int, pad_id: int, *, rank: int = 0, world: int = 1,
    device: torch.device | str = "cpu",
) -> list[MicroBatch]:
    """This process's share of the step's micro-batches on `device` (same count on every rank)."""
    buckets = bucket_by_length(samples, micro_batch_size)
    while len(buckets) % world:  # DDP needs equal backward counts: repeat with zero loss mask
        buckets.append([_without_loss(s) for s in buckets[-1]])
    return [collate(b, pad_id).to(device) for b in buckets[rank::world]]


def _without_loss(sample: Sample) -> Sample:
    return Sample(sample.input_ids, [0] * len(sample), sample.sampling_logprobs, 0.0)
