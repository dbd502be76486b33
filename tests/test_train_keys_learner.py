"""Every config key takes effect, part 2: the keys the Learner reads (optimizer, schedule,
precision, LoRA, loss), and the advantage keys the loop reads. Registry and coverage test:
test_train_keys.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_train_keys import Ctx, _samples, _state, _train_on, check, params

from vfkit import precision
from vfkit.errors import ConfigError

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


@check("trainer.args.micro_batch_size")
def _micro_batch_size(ctx: Ctx) -> None:
    for size, passes in ((1, 4), (2, 2), (4, 1)):
        learner = ctx.learner(f"trainer.args.micro_batch_size={size}")
        calls = []
        learner.peft_model.base_model.model.model.embed_tokens.register_forward_hook(
            lambda *a, calls=calls: calls.append(1))
        learner.update(_samples(4))
        assert len(calls) == passes


@check("trainer.args.shared_prompt_forward")
def _shared_prompt_forward(ctx: Ctx) -> None:
    samples = _samples(4)
    for s in samples[1:]:  # one group: the same 4 prompt tokens
        s.input_ids[:4] = samples[0].input_ids[:4]
    width = max(len(s) for s in samples)
    for on, widths in (("true", [(1, 3), (4, width - 3)]), ("false", [(4, width)])):
        learner = ctx.learner(f"trainer.args.shared_prompt_forward={on}",
                              "trainer.args.micro_batch_size=4")
        seen = []
        learner.peft_model.base_model.model.model.embed_tokens.register_forward_hook(
            lambda _m, inp, _o, seen=seen: seen.append(tuple(inp[0].shape)))
        learner.update(samples)
        assert seen == widths  # on: the prompt once, up to the last position the loss reads


@check("trainer.args.learning_rate", "trainer.args.adam_beta1", "trainer.args.adam_beta2",
       "trainer.args.weight_decay")
def _optimizer(ctx: Ctx) -> None:
    learner = ctx.learner("trainer.args.learning_rate=3e-3", "trainer.args.adam_beta1=0.8",
                          "trainer.args.adam_beta2=0.95", "trainer.args.weight_decay=0.1")
    group = learner.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (3e-3, (0.8, 0.95), 0.1)


@check("trainer.args.loraplus_lr_ratio")
def _loraplus(ctx: Ctx) -> None:
    for ratio in (1, 16):
        learner = ctx.learner("trainer.args.learning_rate=1e-3",
                              f"trainer.args.loraplus_lr_ratio={ratio}")
        before = learner.lora_weights()
        learner.update(_samples(4))
        moved = {n: float((p - before[n]).abs().max()) for n, p in learner.lora_weights().items()}
        # Adam's first step moves each weight with a gradient by its group's lr; A's gradient
        # is 0 while B = 0 (LoRA's init), so only B moves: by 1e-3 * ratio
        assert max(v for n, v in moved.items() if "lora_B" in n) == pytest.approx(1e-3 * ratio)
        assert max(v for n, v in moved.items() if "lora_A" in n) == 0
        lrs = {id(p): g["lr"] for g in learner.optimizer.param_groups for p in g["params"]}
        for name, p in learner.peft_model.named_parameters():
            if p.requires_grad:
                assert lrs[id(p)] == pytest.approx(1e-3 * (ratio if "lora_B" in name else 1))


@check("trainer.args.lr_scheduler_type", "trainer.args.warmup_steps")
def _schedule(ctx: Ctx) -> None:
    learner = ctx.learner('trainer.args.lr_scheduler_type="linear"', "trainer.args.warmup_steps=2",
                          "trainer.args.learning_rate=1.0", "trainer.args.max_steps=4")
    lrs = []
    for _ in range(4):
        lrs.append(learner.update([])["lr"])
    # warm-up step k of 2 at k/2 (transformers starts at 0: a wasted step), then down
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.5])


@check("trainer.args.max_grad_norm")
def _grad_norm(ctx: Ctx) -> None:
    for max_norm in (1e-3, 0.0):
        learner = ctx.learner(f"trainer.args.max_grad_norm={max_norm}")
        seen = []

        def hook(opt, *_a, seen=seen):
            grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
            seen.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

        learner.optimizer.optimizer.register_step_pre_hook(hook)
        reported = learner.update(_samples(4))["grad_norm"]
        if max_norm:
            assert seen[0] == pytest.approx(1e-3, rel=1e-3) and reported > 1e-3
        else:  # 0 = no clipping: the optimizer sees the full gradient
            assert seen[0] == pytest.approx(reported, rel=1e-4)


@check("trainer.args.bf16", "trainer.args.gradient_checkpointing")
def _precision(ctx: Ctx) -> None:
    # "auto" follows the device's bf16 units (the hardware probe is the one thing set here,
    # so the test means the same on a CPU and on a GPU)
    for setting, native, bf16 in (("true", False, True), ("false", True, False),
                                  ('"auto"', True, True), ('"auto"', False, False)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(precision, "bf16_native", lambda _device, native=native: native)
            learner = ctx.learner(f"trainer.args.bf16={setting}",
                                  "trainer.args.gradient_checkpointing=true")
        assert learner.peft_model.base_model.model.is_gradient_checkpointing
        dtypes = []
        layer = learner.peft_model.base_model.model.model.layers[0].mlp.down_proj
        layer.register_forward_hook(lambda _m, _i, out, d=dtypes: d.append(out.dtype))
        learner.update(_samples(2))
        assert dtypes[0] == (torch.bfloat16 if bf16 else torch.float32)
    assert not ctx.learner().peft_model.base_model.model.is_gradient_checkpointing


@check("trainer.args.use_lora", "trainer.args.lora_rank", "trainer.args.lora_alpha",
       "trainer.args.lora_dropout", "trainer.args.lora_target_modules",
       "trainer.args.lora_use_rslora", "trainer.args.lora_modules_to_save")
def _lora(ctx: Ctx) -> None:
    learner = ctx.learner("trainer.args.lora_rank=4", "trainer.args.lora_alpha=8",
                          "trainer.args.lora_dropout=0.1", "trainer.args.lora_use_rslora=true",
                          'trainer.args.lora_target_modules=["q_proj", "v_proj"]',
                          'trainer.args.lora_modules_to_save=["lm_head"]')
    pc = learner.peft_model.peft_config["default"]
    assert (pc.r, pc.lora_alpha, pc.lora_dropout, pc.use_rslora) == (4, 8, 0.1, True)
    assert set(pc.target_modules) == {"q_proj", "v_proj"} and "lm_head" in pc.modules_to_save
    names = [n for n, p in learner.peft_model.named_parameters() if p.requires_grad]
    assert any("q_proj.lora_A" in n for n in names)
    assert not any("k_proj.lora" in n for n in names)
    with pytest.raises(ConfigError, match="use_lora"):
        ctx.cfg("trainer.args.use_lora=false")


@check("trainer.args.lora_train_vision")
def _lora_train_vision(ctx: Ctx) -> None:
    from vfkit.testing.tiny_vlm import make_tiny_vlm

    vlm = make_tiny_vlm(ctx.tmp / "vlm")
    for train_vision in (False, True):
        flag = f"trainer.args.lora_train_vision={str(train_vision).lower()}"
        learner = ctx.learner(f'model="{vlm}"', flag)
        names = [n for n, p in learner.peft_model.named_parameters() if p.requires_grad]
        assert any("language_model" in n for n in names)
        assert any("vision_tower" in n for n in names) == train_vision  # frozen unless asked


def _update(ctx: Ctx, *overrides: str) -> dict:
    return ctx.learner(*overrides).update(_samples(4))


@check("trainer.args.loss_type")
def _loss_type(ctx: Ctx) -> None:
    losses = {t: _update(ctx, f'trainer.args.loss_type="{t}"')["loss"]
              for t in ("grpo", "dr_grpo", "dapo", "cispo")}
    assert len({round(v, 6) for v in losses.values()}) == 4


@check("trainer.args.epsilon", "trainer.args.epsilon_high")
def _clip(ctx: Ctx) -> None:
    # sampler logprob -5.5 vs the tiny model's ~-5.5: ratios near 1, so a tiny epsilon clips
    # (measured from the sampler: from the trainer's own logprobs one step never clips)
    sampler = 'trainer.args.ratio_against="sampler"'
    wide = _update(ctx, sampler, "trainer.args.epsilon=0.9", "trainer.args.epsilon_high=10.0")
    narrow = _update(ctx, sampler, "trainer.args.epsilon=1e-4", "trainer.args.epsilon_high=1e-4")
    high_only = _update(ctx, sampler, "trainer.args.epsilon=0.9", "trainer.args.epsilon_high=1e-4")
    assert wide["clip/frac"] == 0 and narrow["clip/frac"] > high_only["clip/frac"] > 0


@check("trainer.args.ratio_against")
def _ratio_against(ctx: Ctx) -> None:
    # a tiny epsilon clips nearly every token against the sampler; against the trainer's own
    # pre-update logprobs the ratio is exactly 1, so nothing is clipped
    tight = ("trainer.args.epsilon=1e-4", "trainer.args.epsilon_high=1e-4")
    assert _update(ctx, *tight, 'trainer.args.ratio_against="sampler"')["clip/frac"] > 0.5
    assert _update(ctx, *tight, 'trainer.args.ratio_against="trainer"')["clip/frac"] == 0


@check("trainer.args.num_iterations")
def _num_iterations(ctx: Ctx) -> None:
    # three optimizer steps on the batch, one step of the schedule; the later two clipped from
    # the policy that began the batch (a large lr moves it past a 1% clip at once)
    for n in (1, 3):
        learner = ctx.learner(f"trainer.args.num_iterations={n}", "trainer.args.learning_rate=0.01",
                              "trainer.args.epsilon=0.01")
        before = learner.lora_weights()
        metrics = learner.update(_samples(4))
        steps = {float(s["step"]) for s in learner.optimizer.state.values()}
        assert steps == {float(n)} and learner.scheduler.last_epoch == 1
        assert metrics["clip/frac"] == 0  # the first pass: its own logprobs, nothing clipped
        assert ("clip/frac_reuse" in metrics) == (n > 1)
        assert n == 1 or 0 < metrics["clip/frac_reuse"] <= 1
        assert any((p != before[k]).any() for k, p in learner.lora_weights().items())


@check("trainer.args.mask_ratio_low", "trainer.args.mask_ratio_high")
def _ratio_mask(ctx: Ctx) -> None:
    assert _update(ctx, "trainer.args.mask_ratio_low=0.0")["mask/ratio_frac"] == 0
    low = _update(ctx, "trainer.args.mask_ratio_low=0.999", "trainer.args.mask_ratio_high=1e9")
    high = _update(ctx, "trainer.args.mask_ratio_low=0.0", "trainer.args.mask_ratio_high=1.001")
    assert 0 < low["mask/ratio_frac"] < 1 and 0 < high["mask/ratio_frac"] < 1
    assert low["mask/ratio_frac"] + high["mask/ratio_frac"] == pytest.approx(1, abs=0.2)


@check("trainer.args.beta")
def _beta(ctx: Ctx) -> None:
    assert "kl/base" not in _update(ctx)
    learner = ctx.learner("trainer.args.beta=0.5", "trainer.args.learning_rate=0.05")
    learner.update(_samples(4))  # the adapter moves away from the base
    assert learner.update(_samples(4))["kl/base"] > 0



# ----------------------------------------------------------------------------- advantages
@check("trainer.args.scale_rewards", "trainer.args.filter_zero_advantage")
def _advantages(ctx: Ctx) -> None:
    moving, flat = [_state(1.0), _state(0.0)], [_state(0.5), _state(0.5)]
    kept = _train_on([moving, flat], 'trainer.args.scale_rewards="none"', ctx=ctx)
    assert [s.advantage for s in kept] == [0.5, -0.5]  # the flat group was filtered
    kept = _train_on([moving, flat], "trainer.args.filter_zero_advantage=false", ctx=ctx)
    assert [s.advantage for s in kept] == pytest.approx([0.9998, -0.9998, 0.0, 0.0], abs=1e-4)


@check("trainer.args.dynamic_sampling_rounds")  # more in test_train_dynamic_sampling.py
def _dynamic_sampling(ctx: Ctx) -> None:
    batch, _ = ctx.batch("trainer.args.dynamic_sampling_rounds=1", responder=lambda _: "aaaa")
    assert len(batch.groups) == 4  # the 2 flat groups, then the 2 that were sampled for them


@check("trainer.args.mask_truncated_completions", "trainer.args.zero_truncated_completions")
def _truncation(ctx: Ctx) -> None:
    group = [_state(1.0, truncated=True), _state(0.5)]
    assert len(_train_on([group], "trainer.args.mask_truncated_completions=true", ctx=ctx)) == 1
    kept = _train_on([group], "trainer.args.zero_truncated_completions=true",
                     'trainer.args.scale_rewards="none"', ctx=ctx)
    assert [s.advantage for s in kept] == [-0.25, 0.25]  # rewards (0, 0.5)


@pytest.mark.parametrize("check_fn", params(__name__))
def test_key_takes_effect(check_fn: Callable, tiny_model_path: Path, tmp_path: Path) -> None:
    check_fn(Ctx(tiny_model_path, tmp_path))
