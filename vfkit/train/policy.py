"""The trained policy: base model + PEFT LoRA adapter, token logprobs, adapter files.

    model, processor = load_policy(model_dir, cfg.trainer.args)
    logprobs_BT, entropy_BT = token_logprobs(model, input_ids_BT, attention_mask_BT, temperature)

A vision-language model (a config with a vision tower) loads with AutoModelForImageTextToText
and its AutoProcessor; its LoRA adapts the language model only unless `lora_train_vision` is set
(`lora_targets`), and its forward takes the micro-batch's vision inputs (`vision=`).
"""

from __future__ import annotations

import functools
import inspect
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from vfkit.train.config import TrainerArgs
from vfkit.train.config_fields import module_matches
from vfkit.train.vision import is_vlm, load_processor


def resolve_model_dir(name_or_path: str) -> Path:
    """A local HF folder for the model (hub id, offline SmolLM2 GGUF, or a folder)."""
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    from vfkit.hub import resolve_model

    return Path(resolve_model(name_or_path))


def lora_config(args: TrainerArgs, target_modules: str | list[str] | None = None) -> LoraConfig:
    """Every `lora_*` key of the config, passed on to PEFT (targets as `lora_targets` resolved
    them for the model, default: the key as written)."""
    return LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules if target_modules is None else target_modules,
        use_rslora=args.lora_use_rslora,
        modules_to_save=args.lora_modules_to_save or None,
        task_type="CAUSAL_LM",
    )


def language_model_prefix(model: torch.nn.Module) -> str | None:
    """The module name of a VLM's language model (`model.language_model`), None for text."""
    if not is_vlm(getattr(model, "config", None)):
        return None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    names = [name for name, m in model.named_modules() if name and m is decoder]
    names = names or [name for name, _ in model.named_modules()  # models without get_decoder
                      if name.rsplit(".", 1)[-1] in ("language_model", "text_model")]
    if not names:
        raise ValueError(
            f"{type(model).__name__}: cannot tell its language model from its vision tower; set "
            "trainer.args.lora_train_vision = true to let lora_target_modules match model-wide"
        )
    return names[0]


def lora_targets(model: torch.nn.Module, args: TrainerArgs) -> str | list[str]:
    """`lora_target_modules` as PEFT should apply it to `model`.

    Text models: the key unchanged. VLMs: "all-linear" and module names are confined to the
    language model (not the vision tower or the projector; lm_head only when named) by one
    regex PEFT matches against full module names; `lora_train_vision = true` leaves them
    model-wide (PEFT's own all-linear: every linear layer but the output one).
    """
    prefix = None if args.lora_train_vision else language_model_prefix(model)
    if prefix is None:
        return args.lora_target_modules
    targets = args.lora_target_modules
    output = model.get_output_embeddings()
    head = next((n for n, m in model.named_modules() if m is output and n), None)
    extra = []  # an output layer named explicitly (lm_head) is the language side's too
    if targets == "all-linear":
        targets = sorted({
            name.rsplit(".", 1)[-1] for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.startswith(prefix + ".") and m is not output
        })
    elif head is not None and any(module_matches(head, t) for t in targets):
        extra = [re.escape(head)]
    leaves = "|".join(re.escape(t) for t in targets)
    return "|".join([rf"{re.escape(prefix)}\.(?:.*\.)?(?:{leaves})", *extra])


def load_policy(model_dir: Path, args: TrainerArgs) -> tuple[PeftModel, Any]:
    """Base model in fp32 (bf16 is autocast only) with a freshly initialized LoRA adapter,
    and its processor (a VLM's AutoProcessor, else the tokenizer)."""
    processor = load_processor(model_dir)
    vlm = is_vlm(AutoConfig.from_pretrained(model_dir))
    auto = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    base = auto.from_pretrained(model_dir, dtype=torch.float32)
    base.config.use_cache = False
    torch.manual_seed(args.seed)  # LoRA init depends on it: same seed, same adapter
    model = get_peft_model(base, lora_config(args, lora_targets(base, args)))
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, processor


def token_logprobs(
    model: torch.nn.Module,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool = False,
    vision: dict[str, torch.Tensor] | None = None,
    first: int = 0,
    prefix: int = 0,
    group_B: torch.Tensor | None = None,
    cache: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each next token (B × T-1) at the sampling temperature, and its entropy.

    `first`: the first position (of the B × T-1) anyone reads; the ones before it are left at
    0 and their logits never computed. The loss reads completion tokens only, and the prompt
    is most of a short RL sequence, and the output layer (a fifth of SmolLM2's per-token
    forward) and the vocabulary-wide softmax over it feed nothing.
    `prefix`, `group_B`: the rows of each group (`group_B[b]`, 0..G-1) begin with the same
    `prefix` tokens (a group's prompt): those run through the model once a group, and their
    keys and values serve each of its rows (`shared_prefix`); only up to `first`, whose logits
    are read. Gradients flow through the shared keys/values.
    `cache`: the rows' first tokens' keys/values, computed once for the step
    (`StepPrefix.cache_for`); used where those tokens end before `first`, instead of `prefix`.
    `vision`: a VLM micro-batch's image inputs (pixel_values, ...), passed on to the forward.
    """
    first = first if first > 0 and keeps_logits(model) else 0
    if cache is not None and not 0 < cache.get_seq_length() <= first:
        cache = None  # a logit it would skip is read: the rows run whole
    prefix = min(prefix, first) if cache is None else 0
    share = prefix > 0 and not vision and group_B is not None
    share = share and int(group_B.max()) + 1 < len(group_B)  # fewer groups than rows
    cache = shared_prefix(model, input_ids_BT[:, :prefix], group_B) if share else cache
    start = cache.get_seq_length() if cache is not None else 0
    keep = {"logits_to_keep": input_ids_BT.shape[1] - first} if first else {}
    logits_BTV = model(
        input_ids=input_ids_BT[:, start:], attention_mask=attention_mask_BT, **keep,
        **({cache_key(model): cache, "use_cache": True} if cache is not None else {}),
        **(vision or {}),
    ).logits  # fmt: skip
    logits_BTV = logits_BTV[:, :-1].float() / temperature  # positions first .. T-2
    targets_BT = input_ids_BT[:, first + 1 :]
    log_norm_BT = torch.logsumexp(logits_BTV, dim=-1)
    logprobs_BT = logits_BTV.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1) - log_norm_BT
    entropy_BT = entropy(logits_BTV.detach(), log_norm_BT.detach()) if with_entropy else None
    if first:
        logprobs_BT = _left_pad(logprobs_BT, first)
        entropy_BT = None if entropy_BT is None else _left_pad(entropy_BT, first)
    return logprobs_BT, entropy_BT


def shared_prefix(model: torch.nn.Module, prefix_BP: torch.Tensor, group_B: torch.Tensor) -> Any:
    """The keys/values of each group's prefix (one row of `prefix_BP` a group), one copy per row
    (a transformers DynamicCache), or None where the model cannot share them: its forward keeps
    no cache (as under gradient checkpointing), or its cache is not plain full attention
    (sliding windows, recurrent state), which a shared prefix would not reproduce exactly."""
    groups = int(group_B.max()) + 1
    first_row_G = torch.stack([(group_B == g).nonzero()[0, 0] for g in range(groups)])
    cache = _prefix_cache(model, prefix_BP[first_row_G])
    if cache is not None:
        cache.batch_select_indices(group_B)  # row b: its group's keys/values
    return cache


@dataclass
class StepPrefix:
    """Each distinct prompt of a step run once for all its micro-batches (`step_prefix`).

    A micro-batch reads its rows' copies of detached leaves (`cache_for`), so its backward
    stops at them and sums their gradients; `backward()` then sends the sums once through the
    prompts' forward, after the last micro-batch and before the optimizer step. The leaves
    are fp32 (a copy only under bf16 autocast), so the sums are not rounded to bf16.
    """

    outputs: list[torch.Tensor]  # every layer's keys, then values, in the prompts' graph
    leaves: list[torch.Tensor]  # the same tensors, detached, in fp32, collecting gradients

    def cache_for(self, prompt_B: torch.Tensor) -> Any:
        """A transformers DynamicCache holding row b's prompt (`prompt_B[b]`) keys/values."""
        from transformers.cache_utils import DynamicCache

        pairs = zip(self.leaves, self.outputs, strict=True)
        rows = [leaf[prompt_B].to(out.dtype) for leaf, out in pairs]
        half = len(rows) // 2
        return DynamicCache(ddp_cache_data=list(zip(rows[:half], rows[half:], strict=True)))

    def backward(self) -> None:
        # a layer's keys need not depend on any trained weight (layer 0 without LoRA on k_proj)
        pairs = [(out, leaf.grad.to(out.dtype))
                 for out, leaf in zip(self.outputs, self.leaves, strict=True)
                 if leaf.grad is not None and out.requires_grad]  # fmt: skip
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])


def step_prefix(model: torch.nn.Module, prompts_GP: torch.Tensor) -> StepPrefix | None:
    """Run the step's prompts (one row each) once; None where the model cannot share them
    (see `shared_prefix`) or its forward cannot skip the prompt's logits."""
    cache = _prefix_cache(model, prompts_GP) if keeps_logits(model) else None
    if cache is None:
        return None
    outputs = [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]
    return StepPrefix(outputs, [t.detach().float().requires_grad_() for t in outputs])


def _prefix_cache(model: torch.nn.Module, prefix_GP: torch.Tensor) -> Any:
    """The keys/values of `prefix_GP`'s rows as a DynamicCache of plain full-attention layers,
    or None (found out once per model class: not asked again)."""
    from transformers.cache_utils import DynamicLayer

    if _no_shared_prefix(model):
        return None
    out = model(input_ids=prefix_GP, use_cache=True, logits_to_keep=1)
    cache = getattr(out, cache_key(model), None)
    if cache is None:
        return None
    if any(type(layer) is not DynamicLayer for layer in getattr(cache, "layers", [None])):
        _NO_SHARED_PREFIX.add(type(_inner(model)))
        return None
    return cache


_NO_SHARED_PREFIX: set[type] = set()


def cache_key(model: torch.nn.Module) -> str:
    """The forward's (and output's) name for the keys/values: `cache` from transformers 5.24,
    `past_key_values` before."""
    return "cache" if _forward_takes(type(_inner(model)), "cache") else "past_key_values"


def _no_shared_prefix(model: torch.nn.Module) -> bool:
    return type(_inner(model)) in _NO_SHARED_PREFIX


def first_position(mask_BT: torch.Tensor) -> int:
    """The first column where any row of `mask_BT` is set (0 when none is)."""
    columns = mask_BT.any(dim=0).nonzero()
    return int(columns[0]) if len(columns) else 0


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs and most
    VLMs do), looking through DDP's and PEFT's wrappers."""
    return _forward_takes(type(_inner(model)), "logits_to_keep")


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DDP's and PEFT's wrappers."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


@functools.cache
def _forward_takes(cls: type, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters


def _left_pad(values_BT: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(values_BT, (width, 0))


@torch.no_grad()
def entropy(logits_BTV: torch.Tensor, log_norm_BT: torch.Tensor,
            rows_per_chunk: int = 1024) -> torch.Tensor:
    """H = logZ - E_p[logit] per position, a chunk of positions at a time: a metric only, so
    it adds chunk × vocab floats, not two more B × T × V tensors (GBs at a 150k vocabulary)."""
    vocab = logits_BTV.shape[-1]
    logits_NV, log_norm_N = logits_BTV.reshape(-1, vocab), log_norm_BT.reshape(-1)
    out_N = torch.empty_like(log_norm_N)
    for start in range(0, logits_NV.shape[0], rows_per_chunk):
        part = slice(start, start + rows_per_chunk)
        probs = torch.exp(logits_NV[part] - log_norm_N[part, None])
        out_N[part] = log_norm_N[part] - (probs * logits_NV[part]).sum(-1)
    return out_N.reshape(log_norm_BT.shape)


@torch.no_grad()
def base_logprobs(
    model: PeftModel, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, temp: float,
    vision: dict[str, torch.Tensor] | None = None, first: int = 0, prefix: int = 0,
    group_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logprobs under the base model: the same weights with the adapter switched off
    (`first`, `prefix` and `group_B` as in `token_logprobs`)."""
    model = getattr(model, "module", model)  # under DDP: the PeftModel inside (no grad here)
    with model.disable_adapter():
        return token_logprobs(
            model, input_ids_BT, attention_mask_BT, temp, vision=vision, first=first,
            prefix=prefix, group_B=group_B,
        )[0]


@torch.no_grad()
def probe_logprobs(
    model: torch.nn.Module, prompt_ids: list[int], completion_ids: list[int], temperature: float
) -> list[float]:
    """The trainer's logprobs of a server-sampled completion (to verify a hot-loaded adapter).

    The probe prompt is text only (adapter_sync.PROBE_MESSAGES): no vision inputs."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + completion_ids], device=device)
    logprobs, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature)
    model.train(was_training)
    return logprobs[0, len(prompt_ids) - 1 :].tolist()


def save_adapter(model: PeftModel, path: Path) -> Path:
    """Write adapter_model.safetensors + adapter_config.json atomically (tmp dir, rename).

    LoRA tensors only: PEFT would also copy the full base lm_head / embeddings whenever they
    are LoRA targets (for resized vocabularies, which vfkit never makes); servers refuse such
    base-layer tensors, and on a real model they are most of the file."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, save_embedding_layers=False)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path
