"""The trained policy: base model + PEFT LoRA adapter, token logprobs, adapter files.

    model, tokenizer = load_policy(model_dir, cfg.trainer.args)
    logprobs_BT, entropy_BT = token_logprobs(model, input_ids_BT, attention_mask_BT, temperature)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from vfkit.train.config import TrainerArgs


def resolve_model_dir(name_or_path: str) -> Path:
    """A local HF folder for the model (hub id, offline SmolLM2 GGUF, or a folder)."""
    if Path(name_or_path).is_dir():
        return Path(name_or_path)
    from vfkit.hub import resolve_model

    return Path(resolve_model(name_or_path))


def lora_config(args: TrainerArgs) -> LoraConfig:
    """Every `lora_*` key of the config, passed on to PEFT."""
    return LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules,
        use_rslora=args.lora_use_rslora,
        modules_to_save=args.lora_modules_to_save or None,
        task_type="CAUSAL_LM",
    )


def load_policy(model_dir: Path, args: TrainerArgs) -> tuple[PeftModel, object]:
    """Base model in fp32 (bf16 is autocast only) with a freshly initialized LoRA adapter."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base.config.use_cache = False
    torch.manual_seed(args.seed)  # LoRA init depends on it: same seed, same adapter
    model = get_peft_model(base, lora_config(args))
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, tokenizer


def token_logprobs(
    model: torch.nn.Module,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each next token (B × T-1) at the sampling temperature, and its entropy."""
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT).logits
    logits_BTV = logits_BTV[:, :-1].float() / temperature
    targets_BT = input_ids_BT[:, 1:]
    log_norm_BT = torch.logsumexp(logits_BTV, dim=-1)
    logprobs_BT = logits_BTV.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1) - log_norm_BT
    entropy_BT = None
    if with_entropy:
        with torch.no_grad():  # H = logZ - E_p[logit]
            probs_BTV = torch.softmax(logits_BTV.detach(), dim=-1)
            entropy_BT = log_norm_BT.detach() - (probs_BTV * logits_BTV.detach()).sum(-1)
    return logprobs_BT, entropy_BT


@torch.no_grad()
def base_logprobs(
    model: PeftModel, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, temp: float
) -> torch.Tensor:
    """Logprobs under the base model: the same weights with the adapter switched off."""
    model = getattr(model, "module", model)  # under DDP: the PeftModel inside (no grad here)
    with model.disable_adapter():
        return token_logprobs(model, input_ids_BT, attention_mask_BT, temp)[0]


@torch.no_grad()
def probe_logprobs(
    model: torch.nn.Module, prompt_ids: list[int], completion_ids: list[int], temperature: float
) -> list[float]:
    """The trainer's logprobs of a server-sampled completion (to verify a hot-loaded adapter)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + completion_ids], device=device)
    logprobs, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature)
    model.train(was_training)
    return logprobs[0, len(prompt_ids) - 1 :].tolist()


def save_adapter(model: PeftModel, path: Path) -> Path:
    """Write adapter_model.safetensors + adapter_config.json atomically (tmp dir, rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path
