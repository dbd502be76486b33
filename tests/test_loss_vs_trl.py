"""vfkit's loss gradients against TRL's `GRPOTrainer` on the same batch and the same weights.

The race against TRL (benchmarks/race) compares two systems that are meant to differ only in
how they gather rollouts. This checks the other half: given one batch, vfkit's update step
(`vfkit.train.update.micro_batch_loss`, micro-batching included) and TRL's own loss
(`GRPOTrainer._compute_loss`) must give the same gradient on every LoRA parameter, for the
loss types both define the same way, in three cases: on-policy; clipped against an off-policy
sampler (`ratio_against = "sampler"`, TRL's `old_per_token_logps`); and decoupled
(`ratio_against = "trainer"`: TRL's token-level importance-sampling correction of
a vLLM sampler, `importance_sampling_ratio`).

Prompts have one length: TRL left-pads prompts, and its training forward then gives shorter
prompts shifted positions (vfkit right-pads; a padding difference, not a loss difference).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vfkit.train.batching import micro_batches
from vfkit.train.config import TrainerArgs
from vfkit.train.policy import load_policy, token_logprobs
from vfkit.train.samples import Sample
from vfkit.train.update import TokenStats, micro_batch_loss

PROMPT_LEN, MAX_TOKENS, GROUP = 6, 8, 4
COMPLETION_LENS = [8, 3, 5, 1, 7, 8, 2, 4]  # two groups of 4; two hit MAX_TOKENS
ADVANTAGES = [1.2, -0.4, 0.3, -1.1, -0.7, 0.0, 1.5, -0.8]
TEMPERATURE = 0.7


def _args(loss_type: str, ratio_against: str = "trainer") -> TrainerArgs:
    return TrainerArgs(loss_type=loss_type, micro_batch_size=3, max_tokens=MAX_TOKENS,
                       temperature=TEMPERATURE, rollouts_per_example=GROUP, batch_size=8,
                       epsilon=0.2, epsilon_high=0.28, ratio_against=ratio_against)


def _policy(model_path: Path, args: TrainerArgs):
    """vfkit's LoRA policy with B perturbed (at init B = 0 and A would get no gradient)."""
    model, tokenizer = load_policy(model_path, args)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model, tokenizer


def _batch(vocab: int) -> list[tuple[list[int], list[int]]]:
    gen = torch.Generator().manual_seed(2)
    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()
    return [(ids(PROMPT_LEN), ids(n)) for n in COMPLETION_LENS]


def _sampler_logprobs(model, batch, shift: bool) -> list[list[float]]:
    """The trainer's own logprobs of each completion (on-policy), or those shifted by up to
    ±0.4 nats so that the ratio crosses both clip bounds (an off-policy sampler)."""
    gen = torch.Generator().manual_seed(3)
    out = []
    with torch.no_grad():
        for prompt, completion in batch:
            ids = torch.tensor([prompt + completion])
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids), TEMPERATURE)
            lp = lp[0, len(prompt) - 1:]
            if shift:
                lp = lp + (torch.rand(lp.shape, generator=gen) - 0.5) * 0.8
            out.append(lp.tolist())
    return out


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _samples(batch, sampler) -> list[Sample]:
    return [
        Sample(input_ids=p + c, loss_mask=[0] * len(p) + [1] * len(c),
               sampling_logprobs=[0.0] * len(p) + lp, advantage=a)
        for (p, c), lp, a in zip(batch, sampler, ADVANTAGES, strict=True)
    ]


def _vfkit_grads(model, args, batch, sampler, pad_id, stats: TokenStats | None = None) -> dict:
    samples = _samples(batch, sampler)
    totals = (sum(s.num_loss_tokens for s in samples), len(samples))
    model.train()
    for mb in micro_batches(samples, args.micro_batch_size, pad_id):
        micro_batch_loss(model, mb, args, totals, stats or TokenStats())[0].backward()
    return _grads(model)


def _trl_grads(model, tokenizer, args, batch, sampler, tmp_path, mode: str,
               loss_type: str | None = None, proximal: list[list[float]] | None = None) -> dict:
    """TRL's gradient; `proximal` (decoupled mode): the logprobs of the policy that began the
    batch, TRL's `old_per_token_logps` in its later iterations (else the current policy's)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=GROUP,
        max_completion_length=MAX_TOKENS, temperature=TEMPERATURE,
        loss_type=loss_type or args.loss_type, beta=0.0, epsilon=args.epsilon,
        epsilon_high=args.clip_high, use_cpu=True, bf16=False, report_to="none",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=config, train_dataset=Dataset.from_dict({"prompt": ["x"] * 8}),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    # decoupled: TRL's correction of a vLLM sampler, token level (read in _compute_loss)
    trainer.use_vllm = mode == "decoupled"
    pad = tokenizer.pad_token_id
    completion = torch.full((len(batch), MAX_TOKENS), pad)
    completion_mask = torch.zeros(len(batch), MAX_TOKENS, dtype=torch.long)
    old = torch.zeros(len(batch), MAX_TOKENS)
    for i, ((_, c), lp) in enumerate(zip(batch, sampler, strict=True)):
        completion[i, : len(c)], completion_mask[i, : len(c)] = torch.tensor(c), 1
        old[i, : len(c)] = torch.tensor(lp)
    inputs = {
        "prompt_ids": torch.tensor([p for p, _ in batch]),
        "prompt_mask": torch.ones(len(batch), PROMPT_LEN, dtype=torch.long),
        "completion_ids": completion, "completion_mask": completion_mask,
        "advantages": torch.tensor(ADVANTAGES),
        "num_items_in_batch": completion_mask.sum(),
        "old_per_token_logps": old if mode == "clipped" else _padded(proximal),
    }
    if mode == "decoupled":
        trainer_logprobs = proximal or _sampler_logprobs(model, batch, shift=False)
        weight = torch.ones(len(batch), MAX_TOKENS)
        for i, (ours, theirs) in enumerate(zip(trainer_logprobs, sampler, strict=True)):
            weight[i, : len(ours)] = torch.exp(torch.tensor(ours) - torch.tensor(theirs))
        inputs["importance_sampling_ratio"] = weight
    trainer.model.train()
    trainer._compute_loss(trainer.model, inputs).backward()
    return _grads(model)


def _padded(rows: list[list[float]] | None) -> torch.Tensor | None:
    if rows is None:
        return None
    out = torch.zeros(len(rows), MAX_TOKENS)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("mode", ["on-policy", "clipped", "decoupled"])
def test_gradient_equals_trls(
    loss_type: str, mode: str, tiny_model_path: Path, tmp_path: Path
) -> None:
    args = _args(loss_type, "sampler" if mode == "clipped" else "trainer")
    model, tokenizer = _policy(tiny_model_path, args)
    batch = _batch(model.config.vocab_size)
    sampler = _sampler_logprobs(model, batch, shift=mode != "on-policy")
    stats = TokenStats()
    ours = _vfkit_grads(model, args, batch, sampler, tokenizer.pad_token_id, stats)
    theirs = _trl_grads(model, tokenizer, args, batch, sampler, tmp_path, mode)

    clipped_tokens = stats.sums["clip/frac"]
    assert clipped_tokens == 0 if mode != "clipped" else 3 <= clipped_tokens <= stats.tokens - 10
    if mode == "decoupled":  # the sampler really was off: the weights are not all 1
        assert stats.ratio_max > 1.1 and stats.ratio_min < 0.9

    assert ours.keys() == theirs.keys()
    assert any("lora_A" in n for n in ours) and any("lora_B" in n for n in ours)
    flat_ours = torch.cat([g.flatten() for g in ours.values()])
    flat_theirs = torch.cat([theirs[n].flatten() for n in ours])
    assert flat_ours.norm() > 1e-4  # a real gradient, not two zeros
    torch.testing.assert_close(flat_ours, flat_theirs, rtol=1e-4, atol=1e-7)


def test_the_check_sees_a_different_normalization(tiny_model_path: Path, tmp_path: Path) -> None:
    """The comparison is sharp: vfkit's grpo (per-sequence means) against TRL's bnpo (one
    token mean over the batch) differs on this batch of unequal lengths."""
    args = _args("grpo")
    model, tokenizer = _policy(tiny_model_path, args)
    batch = _batch(model.config.vocab_size)
    sampler = _sampler_logprobs(model, batch, shift=False)
    ours = _vfkit_grads(model, args, batch, sampler, tokenizer.pad_token_id)
    theirs = _trl_grads(model, tokenizer, args, batch, sampler, tmp_path, "on-policy", "bnpo")
    flat_ours = torch.cat([g.flatten() for g in ours.values()])
    flat_theirs = torch.cat([theirs[n].flatten() for n in ours])
    assert not torch.allclose(flat_ours, flat_theirs, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("shift", [False, True])
def test_later_iterations_equal_trls(shift: bool, tiny_model_path: Path, tmp_path: Path) -> None:
    """`num_iterations = 2` (decoupled): vfkit's two SGD steps on one batch land where TRL's
    loss puts them: the first from the batch's own policy, the second clipped from it (TRL's
    `old_per_token_logps` of a later iteration), both weighted by that policy over the sampler
    (on-policy, or a sampler off by up to ±0.4 nats)."""
    from accelerate import Accelerator
    from transformers import get_scheduler

    from vfkit.train.update import policy_update

    lr = 2.0
    args = _args("grpo").model_copy(update={"num_iterations": 2, "max_grad_norm": 0.0})
    model, tokenizer = _policy(tiny_model_path, args)
    batch = _batch(model.config.vocab_size)
    proximal = _sampler_logprobs(model, batch, shift=False)
    sampler = _sampler_logprobs(model, batch, shift=shift)
    reference, _ = _policy(tiny_model_path, args)

    samples = _samples(batch, sampler)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    metrics = policy_update(model, optimizer, get_scheduler("constant", optimizer),
                            Accelerator(cpu=True), samples, args, tokenizer.pad_token_id)
    assert metrics["clip/frac_reuse"] > 0.05  # the second step is really clipped

    for _ in range(2):  # TRL's gradient at the current weights, old = the batch's policy
        grads = _trl_grads(reference, tokenizer, args, batch, sampler, tmp_path, "decoupled",
                           proximal=proximal)
        with torch.no_grad():
            for name, p in reference.named_parameters():
                if name in grads:
                    p -= lr * grads[name]
    ours = {n: p for n, p in model.named_parameters() if p.requires_grad}
    theirs = dict(reference.named_parameters())
    moved = max(float((ours[n] - theirs[n]).detach().abs().max()) for n in ours)
    assert moved < 1e-5, moved
    first = _policy(tiny_model_path, args)[0]  # and both really moved from the start
    assert max(float((p - dict(first.named_parameters())[n]).detach().abs().max())
               for n, p in ours.items()) > 1e-2
