"""The model side of training: LoRA policy, AdamW, LR schedule, on plain Accelerate.

    learner = Learner(cfg, run)
    metrics = learner.update(samples)           # a batch's optimizer step(s), text or image
    adapter_dir = learner.save_adapter(version)  # adapters/step_<version>
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, set_seed
from peft.optimizers import create_loraplus_optimizer
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_scheduler

from vfkit.precision import SLOW_BF16, bf16_emulated, resolve_bf16
from vfkit.train import checkpoint
from vfkit.train.adapter_sync import Probe
from vfkit.train.config import RunConfig, TrainerArgs
from vfkit.train.cores import CoreShare
from vfkit.train.placement import cpu_threads, trainer_on_cpu
from vfkit.train.policy import load_policy, probe_logprobs, resolve_model_dir, save_adapter
from vfkit.train.rundir import RunDir, writing
from vfkit.train.samples import Sample
from vfkit.train.update import policy_update
from vfkit.train.vision import ImageInputs, allowed_media_dirs, is_image_processor, text_tokenizer


def trainer_bf16(args: TrainerArgs, device: str) -> bool:
    """Whether the update runs under bf16 autocast on `device`; warns when asked for where
    it is emulated (an explicit `bf16 = true` is obeyed: the user may know better)."""
    if args.bf16 is True and bf16_emulated(device):
        print(f"vf-train: warning: trainer.args.bf16 = true, but {SLOW_BF16}; set bf16 = "
              '"auto" (or false) to train in fp32', file=sys.stderr, flush=True)
    return resolve_bf16(args.bf16, device)


def build_optimizer(model: Any, args: TrainerArgs) -> torch.optim.Optimizer:
    """AdamW over the policy's trainable (LoRA) weights.

    With `loraplus_lr_ratio` > 1 it is LoRA+ (PEFT's helper): B learns at ratio x lr, A at lr.
    LoRA starts with B = 0, so the first updates of A are scaled by B and barely move the
    output; a faster B is what makes an early step count (Hayou et al. 2024).
    """
    adam = {"betas": (args.adam_beta1, args.adam_beta2)}
    if args.loraplus_lr_ratio == 1:
        trainable = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            trainable, lr=args.learning_rate, weight_decay=args.weight_decay, **adam)
    # LoRA on an embedding learns at lr (PEFT's own default for it is a fixed 1e-6)
    return create_loraplus_optimizer(
        model, torch.optim.AdamW, lr=args.learning_rate, loraplus_lr_ratio=args.loraplus_lr_ratio,
        loraplus_weight_decay=args.weight_decay, loraplus_lr_embedding=args.learning_rate, **adam,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, args: TrainerArgs) -> LambdaLR:
    """transformers' `lr_scheduler_type` schedule, with a warm-up that starts above zero.

    transformers' warm-up sets step k of n to (k-1)/n of the learning rate, so the run's first
    optimizer step is at lr 0: a step of rollouts and compute that changes nothing (and, one
    step off-policy, the next two batches still come from the base model). Here step k of the
    warm-up trains at k/n (torch's LinearLR also starts above 0); from step n on the schedule
    is transformers' own.
    """
    hf = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.warmup_steps,
                       num_training_steps=args.max_steps)
    warmup = args.warmup_steps
    if warmup == 0:
        return hf
    shape = hf.lr_lambdas[0]  # one shape for every param group
    return LambdaLR(optimizer, lambda step: shape(step + 1 if step < warmup else step))


class Learner:
    """Policy + optimizer + schedule; only this class touches model weights."""

    def __init__(self, cfg: RunConfig, run: RunDir) -> None:
        args = self.args = cfg.trainer.args
        self.run = run
        # bf16 is applied as explicit autocast in the update (probes stay fp32), so "no" here
        self.accelerator = Accelerator(mixed_precision="no", cpu=trainer_on_cpu(cfg))
        set_seed(args.seed)
        self.bf16 = trainer_bf16(args, self.accelerator.device.type)
        split = cpu_threads(cfg)
        self.cores: CoreShare | None = None  # None: threads fixed (GPU, remote server, OMP set)
        if split and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(split[1])  # the other cores serve rollouts
            self.cores = CoreShare(share=split[1], total=max(split[1], os.cpu_count() or 1))
        self._threads_used: list[int] = []
        model, self.processor = load_policy(resolve_model_dir(cfg.model), args)
        self.tokenizer = text_tokenizer(self.processor)
        # a vision-language policy: turns the samples' image URLs into the model's inputs
        self.images = (ImageInputs(self.processor, allowed_media_dirs(cfg))
                       if is_image_processor(self.processor) else None)
        optimizer = build_optimizer(model, args)
        self.scheduler = build_scheduler(optimizer, args)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def peft_model(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    def autocast(self) -> contextlib.AbstractContextManager:
        device = self.accelerator.device.type
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.bf16)

    def update(self, samples: list[Sample]) -> dict[str, float]:
        """The batch's optimizer step(s) (`num_iterations`; the main process shares samples)."""
        return self._update(self._share(samples))

    def share_cores_with(self, generating: Callable[[], bool]) -> None:
        """Take every CPU core for micro-batches that start while `generating()` is false."""
        if self.cores is not None:
            self.cores.generating = generating

    def _update(self, samples: list[Sample]) -> dict[str, float]:
        self._threads_used.clear()
        metrics = policy_update(
            self.model, self.optimizer, self.scheduler, self.accelerator, samples,
            self.args, self.pad_id, self.autocast, self.images,
            before_micro_batch=self._fit_threads,
        )
        if self.cores is not None:  # a step whose groups were all filtered ran no micro-batch
            used = self._threads_used or [torch.get_num_threads()]
            metrics["cpu/trainer_threads"] = sum(used) / len(used)
        return metrics

    def _fit_threads(self) -> None:
        if self.cores is not None:
            self._threads_used.append(self.cores.fit())

    def _share(self, samples: list[Sample] | None) -> list[Sample] | None:
        """Several processes: the main one sends its samples, the others receive them."""
        if self.accelerator.num_processes == 1:
            return samples
        return broadcast_object_list([samples])[0]

    def follow(self) -> None:
        """Non-main processes: train on each step's shared samples until the main one stops."""
        acc = self.accelerator
        print(f"vf-train: rank {acc.process_index} of {acc.num_processes} trains on the samples"
              " rank 0 shares", file=sys.stderr, flush=True)
        while (samples := self._share(None)) is not None:
            self._update(samples)

    def release_followers(self) -> None:
        """Main process, at the end of the run: tell the other processes to stop."""
        if self.is_main and self.accelerator.num_processes > 1:
            self._share(None)

    def save_adapter(self, version: int) -> Path:
        """adapters/step_<version>: what the server hot-loads."""
        path = self.run.adapter_dir(version)
        with writing("the adapter", path):
            path.parent.mkdir(parents=True, exist_ok=True)
            return save_adapter(self.peft_model, path)

    def probe_logprobs(self, probe: Probe) -> list[float]:
        """The trainer's fp32 logprobs of a probe the server sampled at temperature 1."""
        return probe_logprobs(self.peft_model, probe.prompt_ids, probe.completion_ids, 1.0)

    def save_checkpoint(self, step: int, state: dict[str, Any], policies: dict[int, Path]) -> Path:
        with writing("the checkpoint", self.run.checkpoint_dir(step)):
            return checkpoint.save_checkpoint(
                self.run, step, model=self.peft_model, optimizer=self.optimizer,
                scheduler=self.scheduler, state=state, policies=policies,
                total_limit=self.args.save_total_limit,
            )

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        return checkpoint.load_checkpoint(
            path, model=self.peft_model, optimizer=self.optimizer, scheduler=self.scheduler
        )

    def lora_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the trainable weights (tests compare runs with it)."""
        return {
            n: p.detach().clone() for n, p in self.peft_model.named_parameters() if p.requires_grad
        }
