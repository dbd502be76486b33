"""Per-adapter weights swapped into the LoRA-wrapped linears: one fast path per adapter.

Why: PEFT's unmerged LoRA adds two small matmuls and a dozen Python-level ops to every wrapped
linear at every step — on a 2-core CPU that more than halves decode speed. A batch whose rows
all use one adapter can instead run the plain model with that adapter's variant swapped in:

- **fp32 (or wider) base: W + s·B·A merged** into one dense weight; exact to fp32 rounding.
- **bf16 / fp16 base: W kept, s·B·A applied beside it** (`LowRankLinear`: x·Wᵀ + (x·Aᵀ)·(s·B)ᵀ).
  Merging into bf16 would round each element of W + s·B·A to 8 mantissa bits: an RL update
  of a few steps is mostly smaller than half a bf16 step of W, so it was rounded away or
  up to a whole step, and the server sampled from a different policy than the trainer's
  (measured on SmolLM2-135M: KL to the fp32 policy 0.0087 merged vs 0.0033 beside,
  benchmarks/RESULTS.md). Beside W, the update is rounded relative to itself.

The base weights are never modified: each variant is separate tensors or modules, swapped in
by pointer, so switching back and forth is cheap and exact. A few variants are cached (LRU).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F

Variant = list["torch.nn.Parameter | LowRankLinear | None"]  # per layer; None: layer untouched


class LowRankLinear(torch.nn.Module):
    """A linear layer plus its LoRA term: base(x) + (x·Aᵀ)·(s·B)ᵀ, all in the base's dtype."""

    def __init__(self, base: torch.nn.Module, a: torch.Tensor, scaled_b: torch.Tensor) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("a", a, persistent=False)  # r × in
        self.register_buffer("scaled_b", scaled_b, persistent=False)  # out × r, times scaling

    @property
    def weight(self) -> torch.Tensor:  # PEFT reads base_layer.weight (dtype, device)
        return self.base.weight

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.base(x, *args, **kwargs) + F.linear(F.linear(x, self.a), self.scaled_b)


class MergedWeights:
    """Swap the base linears of PEFT LoRA layers between the base and per-adapter variants."""

    def __init__(self, peft_model: torch.nn.Module, *, max_variants: int = 2) -> None:
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer

        self.peft_model = peft_model
        self.layers = [m for m in peft_model.modules() if isinstance(m, LoraLinear)]
        self.others = [  # LoRA on embeddings, convolutions, ...: not merged here
            m for m in peft_model.modules() if isinstance(m, LoraLayer) and m not in self.layers
        ]
        self.base_layers = [layer.base_layer for layer in self.layers]
        self.base = [layer.base_layer.weight for layer in self.layers]
        self.max_variants = max_variants
        self._variants: OrderedDict[str, Variant] = OrderedDict()
        self.current: str | None = None  # None: base weights in place

    def mergeable(self, name: str | None) -> bool:
        """Plain LoRA on linear layers only (no DoRA, no embedding or saved modules)."""
        if name is None:
            return True
        config = self.peft_model.peft_config.get(name)
        if config is None or getattr(config, "modules_to_save", None):
            return False
        if any(layer.use_dora.get(name, False) for layer in self.layers):
            return False
        return not any(
            name in m.lora_A or name in getattr(m, "lora_embedding_A", {}) for m in self.others
        )

    def use(self, name: str | None) -> None:
        """Put the variant of `name` (None: the base model) into the linears."""
        if name == self.current:
            return
        variant = None if name is None else self._variant(name)
        for i, layer in enumerate(self.layers):  # back to the base first
            self.base_layers[i].weight = self.base[i]
            layer.base_layer = self.base_layers[i]
        for layer, part in zip(self.layers, variant or (), strict=False):
            if isinstance(part, LowRankLinear):
                layer.base_layer = part
            elif part is not None:
                layer.base_layer.weight = part
        self.current = name

    def forget(self, name: str) -> None:
        """Drop a cached variant (its adapter was reloaded or unloaded)."""
        if self.current == name:
            self.use(None)
        self._variants.pop(name, None)

    def _variant(self, name: str) -> Variant:
        if name in self._variants:
            self._variants.move_to_end(name)
            return self._variants[name]
        while len(self._variants) >= self.max_variants:
            oldest = next(iter(self._variants))
            if oldest == self.current:
                self.use(None)
            self._variants.pop(oldest)
        variant = [self._layer_variant(layer, base_layer, name)
                   for layer, base_layer in zip(self.layers, self.base_layers, strict=True)]
        self._variants[name] = variant
        return variant

    @staticmethod
    def _layer_variant(layer, base_layer: torch.nn.Module, name: str):
        """This layer under adapter `name`: a merged weight, a low-rank module, or None."""
        if name not in layer.lora_A:  # this adapter leaves the layer alone
            return None
        base = base_layer.weight
        if torch.finfo(base.dtype).bits < 32:  # bf16 / fp16: keep the update beside W
            a = layer.lora_A[name].weight.detach().to(base.dtype)
            b = layer.lora_B[name].weight.detach().float() * layer.scaling[name]
            return LowRankLinear(base_layer, a, b.to(base.dtype))
        delta = layer.get_delta_weight(name).to(torch.float32)
        weight = (base.detach().to(torch.float32) + delta).to(base.dtype)
        return torch.nn.Parameter(weight, requires_grad=False)
