"""Dense per-adapter weights (W + scale·B·A) swapped into the LoRA-wrapped linears.

Why: PEFT's unmerged LoRA adds two small matmuls and a dozen Python-level ops to every wrapped
linear at every step — on a 2-core CPU that more than halves decode speed. A batch whose rows
all use one adapter can instead run the plain model with that adapter merged into its weights.
The base weights are never modified: each variant is a separate tensor, swapped in by pointer,
so switching back and forth is cheap and exact. A few variants are cached (LRU).
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class MergedWeights:
    """Swap the base linears of PEFT LoRA layers between the base and merged variants."""

    def __init__(self, peft_model: torch.nn.Module, *, max_variants: int = 2) -> None:
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer

        self.peft_model = peft_model
        self.layers = [m for m in peft_model.modules() if isinstance(m, LoraLinear)]
        self.others = [  # LoRA on embeddings, convolutions, ...: not merged here
            m for m in peft_model.modules() if isinstance(m, LoraLayer) and m not in self.layers
        ]
        self.base = [layer.base_layer.weight for layer in self.layers]
        self.max_variants = max_variants
        self._variants: OrderedDict[str, list[torch.nn.Parameter]] = OrderedDict()
        self.current: str | None = None  # None: base weights in place
        self.evictions = 0  # variants dropped (their tensors freed), see LoraManager.generation

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
        """Put the weights of `name` (None: the base model) into the linears."""
        if name == self.current:
            return
        params = self.base if name is None else self._variant(name)
        for layer, param in zip(self.layers, params, strict=True):
            layer.base_layer.weight = param
        self.current = name

    def forget(self, name: str) -> None:
        """Drop a cached variant (its adapter was reloaded or unloaded)."""
        if self.current == name:
            self.use(None)
        if self._variants.pop(name, None) is not None:
            self.evictions += 1

    def _variant(self, name: str) -> list[torch.nn.Parameter]:
        if name in self._variants:
            self._variants.move_to_end(name)
            return self._variants[name]
        while len(self._variants) >= self.max_variants:
            oldest = next(iter(self._variants))
            if oldest == self.current:
                self.use(None)
            self._variants.pop(oldest)
            self.evictions += 1
        merged = []
        for layer, base in zip(self.layers, self.base, strict=True):
            if name not in layer.lora_A:  # this adapter leaves the layer alone
                merged.append(base)
                continue
            delta = layer.get_delta_weight(name).to(torch.float32)
            weight = (base.detach().to(torch.float32) + delta).to(base.dtype)
            merged.append(torch.nn.Parameter(weight, requires_grad=False))
        self._variants[name] = merged
        return merged
