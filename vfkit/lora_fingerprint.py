"""An exact fingerprint of a LoRA adapter's weights, computed the same way by trainer and server.

The trainer fingerprints each adapter it saves; the embedded server fingerprints the tensors it
read when it loads one and reports it (load response and GET /v1/models). Equal fingerprints
prove the served adapter is the one just trained, with no precision noise to tolerate:

    fingerprint_dir(Path("outputs/run/adapters/step_3"))   # 'sha256:…'
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a fingerprint is taken, not with this module
    import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def fingerprint(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, in sorted name order."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return f"sha256:{digest.hexdigest()}"


def fingerprint_dir(adapter_dir: Path) -> str:
    """The fingerprint of the weights saved in `adapter_dir`/adapter_model.safetensors."""
    from safetensors.torch import load_file

    return fingerprint(load_file(str(Path(adapter_dir) / ADAPTER_WEIGHTS)))
