"""The preflight checks that only vision-language runs need (run_checks.py calls them).

What breaks VLM runs before any weight is loaded: a model folder without its processor, LoRA
targets that are not in the language model (the vision tower stays frozen unless
`lora_train_vision`), and image environments on a text-only model. (Imported by run_checks
inside its functions: this module needs run_checks' `Check`.) Prompt lengths count each
image's expanded placeholder tokens (data.prompt_length with the processor), so
`max_prompt_len` is checked against what the server really sends to the model.
"""

from __future__ import annotations

from typing import Any

from vfkit.train.config import RunConfig
from vfkit.train.run_checks import Check
from vfkit.train.vision import is_image_processor, is_vlm


def check_processor(cfg: RunConfig, config: Any, processor: Any) -> Check | None:
    """A VLM's processor is there (None for a text model)."""
    if not is_vlm(config):
        return None
    if not is_image_processor(processor):
        return Check("processor", False, (
            f"model = {cfg.model!r} is a vision-language model ({type(config).__name__}) but "
            "its folder has no image processor (preprocessor_config.json / processor_config."
            "json): save the processor next to the weights (processor.save_pretrained(folder))"
        ))
    return Check("processor", True, (
        f"{type(processor).__name__}: each image becomes {processor.image_token!r} tokens"
    ))


def check_vlm_lora_targets(cfg: RunConfig, model: Any) -> Check:
    """A VLM's LoRA targets, matched the way the trainer applies them (policy.lora_targets)."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    from vfkit.train.policy import language_model_prefix, lora_targets

    a = cfg.trainer.args
    names = [n for n, _ in model.named_modules() if n]
    config = LoraConfig(target_modules=lora_targets(model, a))
    hit = [n for n in names if check_target_module_exists(config, n)]
    prefix = language_model_prefix(model)
    where = "the whole model" if a.lora_train_vision else f"the language model ({prefix})"
    leaves = sorted({n.rsplit(".", 1)[-1] for n in hit})
    language = sorted({
        n.rsplit(".", 1)[-1] for n, m in model.named_modules()
        if n.startswith(f"{prefix}.") and type(m).__name__ == "Linear"
    })
    for target in [] if a.lora_target_modules == "all-linear" else a.lora_target_modules:
        if any(_matches(n, target) for n in hit):
            continue
        if any(_matches(n, target) for n in names):
            fix = (f"{target!r} is in the vision tower or projector, which stay frozen: set "
                   "trainer.args.lora_train_vision = true to adapt them too")
        else:
            fix = f"{target!r} is no module of {cfg.model}"
        return Check("lora", False, (
            f"trainer.args.lora_target_modules: {fix}; the language model's linear layers are "
            f"{', '.join(language)}"
        ))
    if not hit:
        return Check("lora", False, f"trainer.args.lora_target_modules matches no layer of {where}")
    return Check("lora", True, f"{len(hit)} layers of {where}: {', '.join(leaves)}")


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def image_note(processor: Any, prompts: list[Any]) -> str:
    """" with image tokens" when a VLM's processor measured prompts that hold images."""
    from vfkit.images import has_images

    with_images = any(isinstance(p, list) and has_images(p) for p in prompts)
    return " with image tokens" if with_images and is_image_processor(processor) else ""


def image_prompts_need_vlm(cfg: RunConfig, config: Any, prompts: list[Any]) -> str | None:
    """Why a text-only model cannot train on this env's image prompts (None when it can)."""
    from vfkit.images import has_images

    if is_vlm(config) or not any(isinstance(p, list) and has_images(p) for p in prompts):
        return None
    return (
        f"env.id = {cfg.env.id!r} puts images in its prompts but model = {cfg.model!r} is a "
        f"text-only model ({type(config).__name__}); use a vision-language model"
    )

