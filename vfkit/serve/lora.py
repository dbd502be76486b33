"""Runtime LoRA adapters on one base model (PEFT multi-adapter), with vLLM's load/unload rules.

Path and name checks, and reading the adapter's files, run on the HTTP side (`check_load`,
`begin_unload`); the model itself is only changed by `apply_load` / `apply_unload`, which the
engine runs between decode steps. The fingerprint (`vfkit.lora_fingerprint`) is taken over the
tensors read from the file, before any cast, and those same tensors go into the model: what the
server reports is what it serves. Client names may contain "." (`Qwen2.5-0.5B-step1`), which
PEFT module names cannot, so each adapter gets an internal PEFT name (`vfkit_lora_<n>`).
A batch whose rows all use one adapter (or none) runs the plain model with that adapter merged
into its fp32 weights (see lora_merge.py; bf16/fp16 weights run PEFT's unmerged layers, which
keep a small update that merging would round away); a batch that mixes adapters uses PEFT's per-row
`adapter_names=` forward, which measured faster than splitting the batch per adapter
(benchmarks/RESULTS.md).
"""

from __future__ import annotations

import inspect
import threading
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vfkit.serve.errors import APIError
from vfkit.serve.lora_files import (
    BASE,
    AdapterFiles,
    check_load_request,
    check_tensors,
    lora_config,
    module_of,
    read_config,
    read_weights,
)

if TYPE_CHECKING:  # torch is imported by whoever built the model; the HTTP side needs none
    import torch

    from vfkit.serve.lora_copy import LoraTensorMap
    from vfkit.serve.lora_merge import MergedWeights
# adapter_config.json keys that shape the PEFT modules: equal ones -> weights can be copied in
_CONFIG_KEYS_FOR_INPLACE = (
    "r", "lora_alpha", "target_modules", "use_rslora", "use_dora", "layers_to_transform",
    "layers_pattern", "rank_pattern", "alpha_pattern", "modules_to_save", "bias",
    "fan_in_fan_out", "exclude_modules",
)
_MIXED = object()  # marker: the rows of a batch use different adapters
_MAX_SPARE = 2  # unloaded PEFT adapters kept for reuse


def _same_layout(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Can an adapter with config `b` be copied into PEFT modules made for config `a`?"""
    return all(a.get(k) == b.get(k) for k in _CONFIG_KEYS_FOR_INPLACE)


class ServedAdapters:
    """The adapter names being served, with folder and fingerprint (any thread may ask)."""

    def __init__(self) -> None:
        self._paths: dict[str, Path] = {}
        self._fingerprints: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        with self._lock:
            return list(self._paths)

    def paths(self) -> dict[str, Path]:
        """Loaded adapter names and the folders they came from."""
        with self._lock:
            return dict(self._paths)

    def fingerprints(self) -> dict[str, str | None]:
        """Loaded adapter names and the fingerprints of the weights they were loaded from."""
        with self._lock:
            return dict(self._fingerprints)

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._paths

    def begin_unload(self, name: str) -> None:
        """Stop serving `name` at once (404 from now on); the engine frees it once unused."""
        if not self._stop_serving(name):
            raise APIError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name")

    def _serve(self, name: str, files: AdapterFiles) -> None:
        with self._lock:
            self._paths[name], self._fingerprints[name] = files.path, files.fingerprint

    def _stop_serving(self, name: str) -> bool:
        with self._lock:
            self._fingerprints.pop(name, None)
            return self._paths.pop(name, None) is not None


class LoraManager(ServedAdapters):
    """Loaded adapters (name -> path) and the model that serves them."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        allowed_dirs=(),
        max_lora_rank: int = 64,
        merge: bool = True,
    ) -> None:
        super().__init__()
        self.model = model  # the HF model, or a PeftModel around it once an adapter is loaded
        self.allowed_dirs = [Path(d).expanduser().resolve() for d in allowed_dirs]
        self.max_lora_rank = max_lora_rank
        self._configs: dict[str, dict[str, Any]] = {}  # by client name, on the engine side
        self._peft_names: dict[str, str] = {}  # client name -> PEFT adapter name
        self._loads = 0
        self._active: str | None = None
        first = next(model.parameters())
        self._device, self._dtype = first.device, first.dtype
        # transformers 5 names the KV cache argument `cache` (`past_key_values` is deprecated,
        # removed in 5.40); 4.x knows only `past_key_values`
        takes = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in takes else "past_key_values"
        self._module_names = frozenset(name for name, _ in model.named_modules())
        # bf16/fp16 weights are not merged: rounding W + s·B·A to 8 mantissa bits drops most of
        # an RL step's update, so the sampler lags the trainer (benchmarks/RESULTS.md,
        # "Ablations"); PEFT's unmerged layers keep it, at about the same cost as any lean
        # variant of them (measured). fp32 weights merge exactly, so they keep the fast path.
        self._merge = merge and self._dtype.itemsize >= 4
        self._merged: MergedWeights | None = None
        self._layers_enabled = True
        self.path_counts: Counter[str] = Counter()  # forwards by path, shown by GET /stats
        self._changes = 0  # loads and unloads (see `generation`)
        # PEFT adapters of unloaded names, kept for the next load of the same layout: an RL run
        # loads a new name and unloads an old one every step, and creating a PEFT adapter
        # (injecting 210 LoRA layers) costs ~3x the copy (benchmarks/adapter_sync.py)
        self._spare: list[tuple[str, dict[str, Any]]] = []
        self._maps: dict[str, LoraTensorMap] = {}

    # ---- HTTP side: validation, no model changes ----
    def check_load(self, name: str, path: str, inplace: bool) -> AdapterFiles:
        """Validate a load and read the files: 400 for a bad name or config, 403 for a path
        not allowed. Blocking (file reads): call it off the event loop."""
        check_load_request(name, path, loaded=self.has(name), inplace=inplace)
        resolved = Path(path).expanduser().resolve()
        if not any(resolved.is_relative_to(d) for d in self.allowed_dirs):
            allowed = ", ".join(map(str, self.allowed_dirs)) or "none"
            raise APIError(
                403,
                f"Adapter path {resolved} is outside the allowed adapter directories ({allowed}). "
                "Start the server with --allowed-adapter-dir <dir containing the adapter>.",
                param="lora_path",
            )
        config = read_config(resolved)
        rank = config.get("r", 8)
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise APIError(
                400,
                f"adapter_config.json in {resolved}: 'r' must be a positive integer, got {rank!r}.",
                param="lora_path",
            )
        if rank > self.max_lora_rank:
            raise APIError(
                400,
                f"LoRA rank {rank} of '{name}' is greater than max_lora_rank {self.max_lora_rank}; "
                "restart the server with a larger --max-lora-rank.",
                param="lora_path",
            )
        from vfkit.lora_fingerprint import fingerprint

        peft_config = lora_config(resolved, config)
        weights = read_weights(resolved)
        check_tensors(resolved, config, weights)
        self._check_targets(resolved, weights)
        return AdapterFiles(resolved, config, peft_config, weights, fingerprint(weights))

    def _check_targets(self, folder: Path, weights: dict[str, torch.Tensor]) -> None:
        """400 when the adapter's tensors name modules this model lacks (an adapter trained on
        another model, or on a text model's layout for an image model's language model)."""
        modules = {module_of(key) for key in weights if ".lora_" in key}
        absent = sorted(m for m in modules if m not in self._module_names)
        if absent:
            layers = sorted(n for n in self._module_names if n.endswith(".layers"))
            raise APIError(
                400,
                f"The adapter in {folder} targets {len(absent)} module(s) this model does not "
                f"have, e.g. '{absent[0]}' (this model's layers: {', '.join(layers) or 'none'}); "
                "train the adapter on this model.",
                param="lora_path",
            )

    # ---- engine side: runs between decode steps ----
    def apply_load(self, name: str, files: AdapterFiles) -> None:
        """Load (or replace in place) adapter `name` from the tensors `check_load` read.

        If anything fails, `name` is served by no one (never by half-copied weights).
        """
        self._changes += 1
        self._drop_merged()
        try:
            self._install(name, files)
        except Exception:
            self._stop_serving(name)
            if name in self._configs:
                self._delete(name)
            self._track_layers()
            raise
        self.model.requires_grad_(False)
        self.model.to(self._dtype)  # PEFT keeps adapters in fp32; match the base
        self._serve(name, files)
        self._track_layers()

    def _install(self, name: str, files: AdapterFiles) -> None:
        """Make (or reuse, when the shapes match) the PEFT adapter and copy the weights in."""
        from peft import PeftModel, get_peft_model

        old = self._configs.get(name)
        if old is None and (spare := self._take_spare(files.config)) is not None:
            self._configs[name], self._peft_names[name] = files.config, spare
            self._active = None  # forward() activates it when a batch asks for it
        elif old is None or not _same_layout(old, files.config):
            if old is not None:
                self._delete(name)
            self._loads += 1
            peft_name = f"vfkit_lora_{self._loads}"
            self._configs[name], self._peft_names[name] = files.config, peft_name
            if isinstance(self.model, PeftModel):
                self.model.add_adapter(peft_name, files.peft_config)
            else:
                self.model = get_peft_model(self.model, files.peft_config, adapter_name=peft_name)
            self.model.eval()
            self.model.set_adapter(peft_name)  # add_adapter alone leaves the old one active
            self._active = peft_name
        self._configs[name] = files.config
        self._copy_weights(self._peft_names[name], files.weights)

    def _take_spare(self, config: dict[str, Any]) -> str | None:
        for i, (peft_name, spare_config) in enumerate(self._spare):
            if _same_layout(spare_config, config):
                del self._spare[i]
                return peft_name
        return None

    def _copy_weights(self, peft_name: str, weights: dict[str, torch.Tensor]) -> None:
        """Copy the adapter's tensors into its LoRA modules; every LoRA tensor must match."""
        from peft.utils import set_peft_model_state_dict

        from vfkit.serve.lora_copy import LoraTensorMap

        if peft_name not in self._maps:
            self._maps[peft_name] = LoraTensorMap(self.model, peft_name)
        if self._maps[peft_name].copy(weights):
            return

        result = set_peft_model_state_dict(self.model, weights, adapter_name=peft_name)
        unexpected = [k for k in result.unexpected_keys if "lora_" in k]
        missing = [k for k in result.missing_keys if "lora_" in k and f".{peft_name}." in k]
        if unexpected or missing:
            example = (unexpected or missing)[0].replace(f".{peft_name}", "")
            raise ValueError(
                "its weights do not match its adapter_config.json or this model "
                f"({len(unexpected)} unexpected, {len(missing)} missing LoRA tensors, "
                f"e.g. {example})"
            )

    def apply_unload(self, name: str) -> None:
        if name in self._configs:
            self._changes += 1
            self._drop_merged()
            self._delete(name)
            self._track_layers()

    @property
    def generation(self) -> int:
        """Changes whenever the tensors a forward reads may have been replaced or freed
        (adapters loaded, reloaded or unloaded; a merged variant evicted): captured decode
        graphs (graphs.py) older than this are stale."""
        return self._changes + (self._merged.evictions if self._merged is not None else 0)

    def _drop_merged(self) -> None:
        """Put the base weights back and the LoRA layers on before the adapters change."""
        if self._merged is not None:
            self._merged.use(None)
        self._merged = None
        if self._configs:
            self._enable_layers(True)

    def _track_layers(self) -> None:
        """After a load/unload: adapter layers are enabled; merged variants start afresh."""
        self._layers_enabled = True
        if self._configs and self._merge:
            from vfkit.serve.lora_merge import MergedWeights

            self._merged = MergedWeights(self.model)

    def _delete(self, name: str) -> None:
        config = self._configs.pop(name, None)
        peft_name = self._peft_names.pop(name, None)
        if peft_name is not None and config is not None and len(self._spare) < _MAX_SPARE:
            self._spare.append((peft_name, config))  # kept (unserved) for the next load
            self._active = None
            return
        self._maps.pop(peft_name, None)
        if len(self._configs) == 0 and not self._spare:
            if hasattr(self.model, "unload"):
                self.model = self.model.unload()  # back to the plain HF model
            self._active = None
            return
        if peft_name is not None and peft_name in getattr(self.model, "peft_config", {}):
            self.model.delete_adapter(peft_name)  # PEFT then activates one of the others
        self._active = None

    def forward(self, adapters: list[str | None], **inputs: Any):
        """Run the model on a batch whose row i uses adapter `adapters[i]` (None: the base).
        `cache=` is passed on under the name this transformers version takes."""
        if "cache" in inputs and self._cache_kw != "cache":
            inputs[self._cache_kw] = inputs.pop("cache")
        if not self._configs:
            self.path_counts["plain"] += 1
            if self._spare:  # only unloaded adapters left in the PEFT model: keep them off
                self._enable_layers(False)
            return self.model(**inputs)
        adapters = [self._peft_names[a] if a is not None else None for a in adapters]
        distinct = set(adapters)
        single = next(iter(distinct)) if len(distinct) == 1 else _MIXED
        merged = self._merged
        if merged is not None and single is not _MIXED and merged.mergeable(single):
            self.path_counts["merged" if single else "plain"] += 1
            self._enable_layers(False)
            merged.use(single)
            return self.model(**inputs)
        if merged is not None:
            merged.use(None)
        self._enable_layers(single is not None)
        if single is None:
            self.path_counts["plain"] += 1
            return self.model(**inputs)
        if single is _MIXED:
            self.path_counts["mixed"] += 1
            return self.model(**inputs, adapter_names=[a or BASE for a in adapters])
        self.path_counts["peft"] += 1
        if single != self._active:
            self.model.set_adapter(single)
            self._active = single
        return self.model(**inputs)

    def _enable_layers(self, enabled: bool) -> None:
        if enabled != self._layers_enabled:
            if enabled:
                self.model.base_model.enable_adapter_layers()
            else:
                self.model.base_model.disable_adapter_layers()
            self._layers_enabled = enabled
