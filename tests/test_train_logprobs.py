"""token_logprobs with `first`: the output layer skips the positions no loss reads, and the
positions it keeps, and their gradients, are the full forward's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from vfkit.train.batching import micro_batches
from vfkit.train.config import TrainerArgs
from vfkit.train.policy import first_position, keeps_logits, load_policy, token_logprobs
from vfkit.train.samples import Sample


def batch(pad_id: int):
    """Three right-padded samples whose completions start at columns 4, 6 and 9."""
    rows = [(4, 5), (6, 2), (9, 3)]  # (prompt tokens, completion tokens)
    samples = [Sample(list(range(10, 10 + p + c)), [0] * p + [1] * c, [0.0] * p + [-1.0] * c, 1.0)
               for p, c in rows]
    return micro_batches(samples, 3, pad_id)[0]


def test_first_position_is_the_first_column_any_row_trains_on() -> None:
    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 0, 0]])
    assert first_position(mask) == 2
    assert first_position(torch.zeros(2, 5)) == 0  # nothing trained: keep everything


def test_kept_positions_and_their_gradients_equal_the_full_forward(tiny_model_path: Path) -> None:
    model, tokenizer = load_policy(tiny_model_path, TrainerArgs(lora_rank=4, lora_alpha=8))
    assert keeps_logits(model)  # through PEFT's wrapper to the Llama's forward
    mb = batch(tokenizer.pad_token_id or 0)
    loss_mask = mb.loss_mask_BT[:, 1:]
    first = first_position(loss_mask)
    assert first == 3  # the first completion token is column 4, predicted from position 3

    seen: list[int] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, _i, out: seen.append(out.shape[1]))

    def run(start: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        logprobs, entropy = token_logprobs(model, mb.input_ids_BT, mb.attention_mask_BT, 0.7,
                                           with_entropy=True, first=start)
        (logprobs * loss_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return torch.stack([logprobs.detach(), entropy]), grads

    full, full_grads = run(0)
    kept, kept_grads = run(first)
    hook.remove()
    width = mb.input_ids_BT.shape[1]
    assert seen == [width, width - first]  # the output layer ran on the kept positions only
    assert kept.shape == full.shape
    assert torch.allclose(kept[..., first:], full[..., first:], atol=1e-5)
    assert torch.count_nonzero(kept[..., :first]) == 0  # not computed: left at 0
    assert max((kept_grads[n] - g).abs().max().item() for n, g in full_grads.items()) < 1e-6
    assert sum(g.abs().sum().item() for g in full_grads.values()) > 0


class NoKeep(torch.nn.Module):
    """A causal LM whose forward has no `logits_to_keep` (as some VLMs): all logits, always."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.head = torch.nn.Linear(8, 32)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.head(self.embed(input_ids)))


def test_a_model_without_logits_to_keep_gets_the_full_forward() -> None:
    model = NoKeep()
    assert not keeps_logits(model)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    full, _ = token_logprobs(model, ids, torch.ones_like(ids), 1.0)
    kept, _ = token_logprobs(model, ids, torch.ones_like(ids), 1.0, first=2)
    assert torch.equal(kept, full)  # `first` is an optimisation, never a different answer

