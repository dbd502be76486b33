"""The four policy-gradient losses, checked against hand arithmetic."""

from __future__ import annotations

import math

import pytest
import torch

from vfkit.train.losses import LOSSES, LossInputs


def inputs(logprobs, sampling, advantages, mask, **kw) -> LossInputs:
    defaults = {"epsilon_low": 0.2, "epsilon_high": 0.2, "total_tokens": 3, "total_sequences": 2,
                "max_tokens": 4}
    return LossInputs(
        logprobs_BT=torch.tensor(logprobs, requires_grad=True),
        old_logprobs_BT=torch.tensor(sampling),
        advantages_B=torch.tensor(advantages),
        mask_BT=torch.tensor(mask),
        **{**defaults, **kw},
    )


# seq 0: two tokens, A = +1; seq 1: one token (second position padded), A = -1; ratio 1 everywhere
ON_POLICY = ([[-1.0, -2.0], [-0.5, 0.0]], [[-1.0, -2.0], [-0.5, 0.0]], [1.0, -1.0],
             [[1.0, 1.0], [1.0, 0.0]])


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        ("grpo", 0.0),  # per-seq means: (-1 - 1)/2 = -1 and +1/1 = +1 -> (-1 + 1) / 2 seqs = 0
        ("dapo", -1 / 3),  # all tokens: (-1 - 1 + 1) / 3 tokens
        ("dr_grpo", -0.125),  # sums / max_tokens: -2/4 and 1/4 -> (-0.5 + 0.25) / 2 seqs
        ("cispo", 2.5 / 3),  # -w*A*logp: 1*1*1 + 1*1*2 + (-(1*-1*-0.5)) = 1 + 2 - 0.5 over 3
    ],
)
def test_on_policy_values(loss_type: str, expected: float) -> None:
    out = LOSSES[loss_type](inputs(*ON_POLICY))
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert not out.clipped_BT.any()


def test_ppo_clip_bounds_and_zero_gradient() -> None:
    ln2 = math.log(2.0)
    x = inputs([[ln2], [-ln2]], [[0.0], [0.0]], [1.0, -1.0], [[1.0], [1.0]],
               total_tokens=2, total_sequences=2, epsilon_high=0.28)
    out = LOSSES["dapo"](x)
    # ratio 2, A=+1: -min(2, 1.28) = -1.28; ratio 0.5, A=-1: -min(-0.5, -0.8) = 0.8 -> /2 tokens
    assert out.loss.item() == pytest.approx((-1.28 + 0.8) / 2, abs=1e-6)
    assert out.clipped_BT.all()
    out.loss.backward()
    assert torch.count_nonzero(x.logprobs_BT.grad) == 0  # clipped tokens carry no gradient


def test_cispo_keeps_gradient_of_clipped_tokens() -> None:
    ln2 = math.log(2.0)
    x = inputs([[ln2]], [[0.0]], [1.0], [[1.0]], total_tokens=1, total_sequences=1)
    out = LOSSES["cispo"](x)
    assert out.loss.item() == pytest.approx(-1.2 * ln2, abs=1e-6)  # -clip(2, 0.8, 1.2)*1*ln2
    out.loss.backward()
    assert x.logprobs_BT.grad.item() == pytest.approx(-1.2)  # d/dlogp of -1.2 * logp


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo"])
def test_decoupled_ratio_weights_instead_of_clipping(loss_type: str) -> None:
    """ratio_against = "trainer": old = the trainer's detached logprobs (ratio 1, no clip);
    the sampler's ratio 2 becomes a weight: loss -2·A per token, gradient -2 (not 0)."""
    ln2 = math.log(2.0)
    logprobs = torch.tensor([[ln2]], requires_grad=True)
    x = LossInputs(logprobs_BT=logprobs, old_logprobs_BT=logprobs.detach(),
                   advantages_B=torch.tensor([1.0]), mask_BT=torch.tensor([[1.0]]),
                   epsilon_low=0.2, epsilon_high=0.2, total_tokens=1, total_sequences=1,
                   max_tokens=1, weight_BT=torch.tensor([[2.0]]))
    out = LOSSES[loss_type](x)
    expected = -2 * ln2 if loss_type == "cispo" else -2.0  # cispo: -w·A·logp; else -w·r·A
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert not out.clipped_BT.any()
    out.loss.backward()
    assert logprobs.grad.item() == pytest.approx(-2.0)


@pytest.mark.parametrize("loss_type", sorted(LOSSES))
def test_micro_batches_sum_to_the_whole_batch(loss_type: str) -> None:
    torch.manual_seed(0)
    logprobs = -torch.rand(4, 5)
    sampling = logprobs + 0.1 * torch.randn(4, 5)
    advantages = torch.tensor([1.0, -0.5, 0.3, -0.8])
    mask = (torch.rand(4, 5) > 0.3).float()
    common = {"epsilon_low": 0.2, "epsilon_high": 0.3, "total_tokens": int(mask.sum()),
              "total_sequences": 4, "max_tokens": 5}

    def loss(rows: slice) -> float:
        x = LossInputs(logprobs[rows], sampling[rows], advantages[rows], mask[rows], **common)
        return LOSSES[loss_type](x).loss.item()

    assert loss(slice(0, 2)) + loss(slice(2, 4)) == pytest.approx(loss(slice(0, 4)), abs=1e-6)


def test_kl_term_adds_beta_times_kl() -> None:
    x = inputs(*ON_POLICY, kl_BT=torch.tensor([[0.5, 0.5], [0.5, 0.0]]), beta=0.1)
    # dapo: base -1/3 plus 0.1 * (0.5 + 0.5 + 0.5) / 3 tokens = 0.05
    assert LOSSES["dapo"](x).loss.item() == pytest.approx(-1 / 3 + 0.05, abs=1e-6)


def test_the_entropy_metric_is_the_categorical_entropy_computed_in_chunks() -> None:
    """Chunked so that it never holds two more B × T × V tensors; the value must not change."""
    from vfkit.train.policy import entropy

    torch.manual_seed(0)
    logits = torch.randn(3, 7, 50) * 4
    log_norm = torch.logsumexp(logits, dim=-1)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    for rows in (1, 5, 21, 4096):  # chunks that split, match and exceed the 21 positions
        assert torch.allclose(entropy(logits, log_norm, rows_per_chunk=rows), expected, atol=1e-5)
