"""Copy an adapter file's LoRA tensors straight into a PEFT adapter's parameters.

PEFT's `set_peft_model_state_dict` re-maps every key through its generic machinery (~75 ms for
a rank-16 all-linear SmolLM2 adapter on a 2-core CPU); an RL run hot-loads an adapter after
every step, always of the same layout, so the key -> parameter map is built once per PEFT
adapter and the copy is then one `copy_` per tensor. Anything but plain `lora_A`/`lora_B`
weights (DoRA magnitudes, embedding LoRA, biases) returns False: the caller falls back to PEFT.
"""

from __future__ import annotations

import torch

_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


class LoraTensorMap:
    """For one PEFT adapter: stored key ("...q_proj.lora_A.weight") -> its parameter."""

    def __init__(self, model: torch.nn.Module, peft_name: str) -> None:
        marker = f".{peft_name}.weight"
        self.params: dict[str, torch.nn.Parameter] = {}
        for name, param in model.named_parameters():
            if name.endswith(marker) and (".lora_A." in name or ".lora_B." in name):
                self.params[name.removesuffix(marker) + ".weight"] = param

    def copy(self, weights: dict[str, torch.Tensor]) -> bool:
        """Copy every tensor in; False (nothing copied) unless they match the map exactly."""
        keys = {_stored_key(k) for k in weights}
        if not all(k.endswith(_SUFFIXES) for k in weights) or keys != set(self.params):
            return False
        pairs = [(self.params[_stored_key(k)], t) for k, t in weights.items()]
        if any(p.shape != t.shape for p, t in pairs):
            return False
        with torch.no_grad():
            for param, tensor in pairs:
                param.copy_(tensor)
        return True


def _stored_key(key: str) -> str:
    """Saved adapters name tensors 'base_model.model.<module>.lora_A.weight'."""
    return key if key.startswith("base_model.model.") else "base_model.model." + key
