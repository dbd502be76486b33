"""A group's prompt runs once per micro-batch: bucketing by prompt, and the shared keys/values
give the logprobs, gradients and optimizer step of the unshared forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from transformers import MistralConfig, MistralForCausalLM, get_scheduler

from vfkit.train import policy
from vfkit.train.batching import common_prefix, micro_batches, step_prompts
from vfkit.train.config import TrainerArgs
from vfkit.train.learner import build_optimizer
from vfkit.train.policy import first_position, load_policy, token_logprobs
from vfkit.train.samples import Sample
from vfkit.train.update import policy_update

ARGS = TrainerArgs(lora_rank=4, lora_alpha=8, mask_ratio_low=0.0, mask_ratio_high=1e30)


def group(prompt: list[int], completions: list[int], advantage: float = 1.0) -> list[Sample]:
    """One prompt's samples, completion lengths as given (ids differ from the first token on)."""
    out = []
    for i, n in enumerate(completions):
        ids = prompt + [(100 + 7 * i + j) % 250 + 3 for j in range(n)]
        mask = [0] * len(prompt) + [1] * n
        out.append(Sample(ids, mask, [-1.0 * m for m in mask], advantage * (-1) ** i))
    return out


def test_rows_of_a_prompt_form_a_group_and_share_its_prefix() -> None:
    a, b = group([5, 6, 7], [2, 4, 3]), group([5, 6, 8, 9], [1, 6])
    assert common_prefix([s.input_ids for s in a]) == 3
    assert common_prefix([[1, 2], [1, 2, 3]]) == 2 and common_prefix([[1], [2]]) == 0
    (mb,) = micro_batches(b, 4, pad_id=0)
    assert mb.shared_prefix == 4 and mb.group_B.tolist() == [0, 0]
    (mb,) = micro_batches(a + b, 8, pad_id=0)  # by length: 10 (b), 7 (a), 6 (a), 5 (a), 5 (b)
    assert mb.shared_prefix == 3 and mb.group_B.tolist() == [0, 1, 1, 1, 0]


def randomize_lora(model: torch.nn.Module) -> None:
    """LoRA B starts at 0, where A's gradient is 0: give both values so every gradient shows."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def logprobs_and_grads(model, mb, share: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss_mask = mb.loss_mask_BT[:, 1:]
    first = first_position(loss_mask)
    logprobs, _ = token_logprobs(model, mb.input_ids_BT, mb.attention_mask_BT, 0.7, first=first,
                                 prefix=mb.shared_prefix if share else 0, group_B=mb.group_B)
    (logprobs * loss_mask * mb.advantages_B[:, None]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return (logprobs * loss_mask).detach(), grads


def test_shared_prompts_give_the_unshared_logprobs_and_gradients(tiny_model_path: Path) -> None:
    """Two groups in one micro-batch: prompts of 11 and 13 tokens (the first 10 run once a
    group: the 11th predicts the first completion token), completions of different lengths."""
    model, tokenizer = load_policy(tiny_model_path, ARGS)
    randomize_lora(model)
    samples = group(list(range(20, 31)), [4, 9, 1]) + group(list(range(40, 53)), [6, 2], -1.0)
    (mb,) = micro_batches(samples, 5, tokenizer.pad_token_id or 0)
    assert mb.shared_prefix == 11 and mb.group_B.tolist() == [0, 1, 0, 1, 0]  # by length
    widths: list[tuple[int, int]] = []
    embed = model.get_input_embeddings()
    hook = embed.register_forward_hook(lambda _m, inp, _o: widths.append(tuple(inp[0].shape)))
    full, full_grads = logprobs_and_grads(model, mb, share=False)
    shared, shared_grads = logprobs_and_grads(model, mb, share=True)
    hook.remove()
    width = mb.input_ids_BT.shape[1]
    # the prompt up to the position whose logits predict the first completion token, once
    assert widths == [(5, width), (2, 10), (5, width - 10)]
    assert (shared - full).abs().max() < 1e-5
    assert max((shared_grads[n] - g).abs().max().item() for n, g in full_grads.items()) < 1e-5
    assert min(g.abs().sum().item() for g in full_grads.values()) > 0  # every LoRA matrix


def test_rows_of_different_prompts_only_run_unshared(tiny_model_path: Path) -> None:
    model, _ = load_policy(tiny_model_path, ARGS)
    samples = group([7, 8, 9], [2]) + group([7, 8, 10], [3])
    (mb,) = micro_batches(samples, 2, 0)
    assert mb.group_B.tolist() == [0, 1]  # two groups of one: nothing to share
    widths: list[int] = []
    model.get_input_embeddings().register_forward_hook(
        lambda _m, inp, _o: widths.append(inp[0].shape[1]))
    token_logprobs(model, mb.input_ids_BT, mb.attention_mask_BT, 1.0, first=2,
                   prefix=mb.shared_prefix, group_B=mb.group_B)
    assert widths == [mb.input_ids_BT.shape[1]]


@pytest.mark.parametrize("shared", [True, False])
def test_a_step_is_the_same_with_or_without_sharing(tiny_model_path: Path, shared) -> None:
    """Two groups, micro-batches of 3 (by length: groups mixed and split): the optimizer step
    and its metrics match the unshared step."""
    samples = group([9, 8, 7, 6, 5], [3, 6, 2, 5]) + group([9, 8, 4], [7, 1, 4, 2], 2.0)

    def step(args: TrainerArgs) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        model, _ = load_policy(tiny_model_path, args)
        randomize_lora(model)
        accelerator = Accelerator()  # the machine's device: the GPU where there is one
        model.to(accelerator.device)
        optimizer = build_optimizer(model, args)
        scheduler = get_scheduler("constant", optimizer)
        out = policy_update(model, optimizer, scheduler, accelerator, samples, args, 0)
        return out, {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}

    args = ARGS.model_copy(update={"micro_batch_size": 3, "learning_rate": 1e-3})
    base, base_params = step(args.model_copy(update={"shared_prompt_forward": False}))
    other, params = step(args.model_copy(update={"shared_prompt_forward": shared}))
    assert other["grad_norm"] > 0
    for key in ("loss", "grad_norm", "entropy", "ratio/mean"):
        assert other[key] == pytest.approx(base[key], rel=1e-4, abs=1e-6), key
    assert max((params[n] - p).abs().max().item() for n, p in base_params.items()) < 1e-6


@pytest.mark.parametrize(
    ("bf16", "targets"),
    [(False, "all-linear"), (True, "all-linear"), (False, ["q_proj", "v_proj"])],
    ids=["fp32", "bf16-autocast", "no-lora-on-k_proj"],
)
def test_a_step_runs_each_prompt_once_for_all_its_micro_batches(
    tiny_model_path: Path, bf16: bool, targets: str | list[str]
) -> None:
    """Two prompts (7 and 5 tokens) in micro-batches of 3: one forward of both prompts up to
    the shorter one's last token, then each micro-batch's rest of its rows; the LoRA gradients
    (through the prompts too) equal the unshared step's (to bf16's precision under autocast,
    where the prompts' keys/values are bf16 and their gradient sums fp32). Without LoRA on
    k_proj, layer 0's keys depend on no trained weight: nothing to send back through them."""
    samples = group(list(range(30, 37)), [3, 6, 2, 5]) + group([30, 31, 32, 33, 9], [7, 1])
    prompts = step_prompts(samples)
    assert prompts is not None  # 4 tokens each: the 5th predicts the shorter one's first
    assert prompts.ids_GP.tolist() == [[30, 31, 32, 33]] * 2

    def grads(args: TrainerArgs) -> tuple[list[tuple[int, int]], dict[str, torch.Tensor]]:
        model, _ = load_policy(tiny_model_path, args)
        randomize_lora(model)
        accelerator = Accelerator()  # the machine's device: the GPU where there is one
        model.to(accelerator.device)
        widths: list[tuple[int, int]] = []
        model.get_input_embeddings().register_forward_hook(
            lambda _m, inp, _o: widths.append(tuple(inp[0].shape)))
        captured: dict[str, torch.Tensor] = {}  # each gradient after its last accumulation
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(
                    lambda p, n=name: captured.__setitem__(n, p.grad.clone()))
        optimizer = build_optimizer(model, args)
        device = accelerator.device.type
        autocast = (lambda: torch.autocast(device, dtype=torch.bfloat16)) if bf16 else None
        policy_update(model, optimizer, get_scheduler("constant", optimizer), accelerator,
                      samples, args, 0, **({"autocast": autocast} if bf16 else {}))  # fmt: skip
        return widths, captured

    args = ARGS.model_copy(update={"micro_batch_size": 3, "lora_target_modules": targets})
    shared_widths, shared = grads(args)
    full_widths, full = grads(args.model_copy(update={"shared_prompt_forward": False}))
    assert shared_widths[0] == (2, 4)
    assert [w for _, w in shared_widths[1:]] == [w - 4 for _, w in full_widths]
    assert len(full) == len(shared) > 0
    tolerance = 2e-2 if bf16 else 1e-5  # relative to each gradient's largest entry
    for name, g in full.items():
        assert (shared[name] - g).abs().max().item() <= tolerance * g.abs().max().item(), name
    assert min(g.abs().sum().item() for g in full.values()) > 0


def test_a_sliding_window_model_falls_back_to_the_full_forward(tmp_path: Path) -> None:
    """A sliding-window cache keeps only the window: sharing it would not be the full forward."""
    config = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           sliding_window=4, max_position_embeddings=64)
    torch.manual_seed(0)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    model = MistralForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    samples = group([3, 4, 5, 6, 7, 8], [3, 2], advantage=1.0)
    for s in samples:
        s.input_ids = [i % 64 for i in s.input_ids]
    (mb,) = micro_batches(samples, 2, 0)
    full, _ = token_logprobs(model, mb.input_ids_BT, mb.attention_mask_BT, 1.0, first=5)
    again, _ = token_logprobs(model, mb.input_ids_BT, mb.attention_mask_BT, 1.0, first=5,
                              prefix=mb.shared_prefix, group_B=mb.group_B)
    assert torch.allclose(again, full, atol=1e-6)
    assert MistralForCausalLM in policy._NO_SHARED_PREFIX  # found out on the first try
