"""Load the served model onto its device in its dtype, and build the generation engine.

    engine = build_engine(ServeConfig("HuggingFaceTB/SmolLM2-135M-Instruct"))

`ServeConfig` (config.py) says what to serve; this module turns it into a running `Engine`.
"""

from __future__ import annotations

import logging
import os

from vfkit.precision import SLOW_BF16, bf16_emulated, bf16_native
from vfkit.serve.config import ServeConfig

log = logging.getLogger("vfkit.serve")


def choose_dtype(name: str, device: str):
    """'auto': bf16 on GPUs and on bf16-capable CPUs, else fp32; otherwise the named dtype."""
    import torch

    if name != "auto":
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown --dtype {name!r}: use auto, bfloat16, float16 or float32")
        if dtype == torch.bfloat16 and bf16_emulated(device):
            log.warning("--dtype %s: %s; --dtype auto serves fp32 here", name, SLOW_BF16)
        return dtype
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if bf16_native(device) else torch.float32


def choose_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def build_engine(config: ServeConfig):
    """Resolve and load the model, and start the generation worker."""
    import torch

    from vfkit.hub import resolve_model
    from vfkit.serve.engine import Engine
    from vfkit.serve.lora import LoraManager

    threads = config.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    path = resolve_model(config.model)
    device = choose_device(config.device)
    dtype = choose_dtype(config.dtype, device)
    model, tokenizer, processor = load_served_model(path, dtype, device)
    model.requires_grad_(False)
    log.info(
        "loaded %s from %s on %s as %s (%d threads%s)", config.model, path, device, dtype, threads,
        ", images" if processor is not None else "",
    )  # fmt: skip
    text_config = model.config.get_text_config()
    max_len = config.max_model_len or getattr(text_config, "max_position_embeddings", None) or 2048
    engine = Engine(
        LoraManager(
            model, allowed_dirs=config.allowed_adapter_dirs, max_lora_rank=config.max_lora_rank
        ),
        tokenizer,
        max_model_len=int(max_len),
        eos_token_ids=_eos_ids(model, tokenizer),
        max_batch=config.max_num_seqs,
        max_queue=config.max_queue,
        max_prefill_tokens=config.max_prefill_tokens,
        max_loras=config.max_loras,
        threads=threads,
        model_path=str(path),
        processor=processor,
        static_decode=use_cuda_graphs(config.cuda_graphs, device, processor),
    )
    engine.start()
    return engine


def use_cuda_graphs(setting: str, device: str, processor) -> bool:
    """Replay decode steps as CUDA graphs (graphs.py)? auto: on CUDA, for text models (image
    models decode with positions their processor computes, not captured here)."""
    if setting == "off":
        return False
    if not device.startswith("cuda"):
        if setting == "on":
            raise ValueError(
                f"--cuda-graphs on needs a CUDA device, but the model is on {device}: pass "
                "--device cuda on a GPU machine, or leave --cuda-graphs off"
            )
        return False
    if processor is not None:
        if setting == "on":
            raise ValueError(
                "--cuda-graphs on: image-text models are decoded without graphs; "
                "use --cuda-graphs auto or off"
            )
        return False
    return True


def load_served_model(path, dtype, device: str):
    """(model, tokenizer, processor): an image-text-to-text model with its processor, else a
    causal LM with its tokenizer (processor None)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not is_vision_model(AutoConfig.from_pretrained(path)):
        return load_model(AutoModelForCausalLM, path, dtype, device), _tokenizer(path), None
    from transformers import AutoModelForImageTextToText

    from vfkit.hub import check_vlm_support

    check_vlm_support(path)
    processor = load_processor(path)
    model = load_model(AutoModelForImageTextToText, path, dtype, device)
    return model, processor.tokenizer, processor


def is_vision_model(config) -> bool:
    """True for image-text-to-text models (LLaVA, Idefics3/SmolVLM, Qwen2/2.5/3-VL, ...)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return (
        config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        and getattr(config, "vision_config", None) is not None
    )


def load_processor(path):
    """The model folder's processor (tokenizer + image processor); a clear error without one."""
    from transformers import AutoProcessor

    problem = None
    try:
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError, ImportError) as exc:
        processor, problem = None, str(exc).splitlines()[0] if str(exc) else repr(exc)
    if processor is None or getattr(processor, "image_processor", None) is None:
        raise ValueError(
            f"{path} holds an image-text-to-text model but no usable processor "
            f"(processor_config.json / preprocessor_config.json){': ' + problem if problem else ''}"
            "; save the model's processor there (AutoProcessor.from_pretrained(...)"
            ".save_pretrained(path))."
        )
    return processor


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_model(auto_cls, path, dtype, device: str = "cpu"):
    """The model in eval mode on `device` (PyTorch's SDPA attention measured fastest on CPU)."""
    return auto_cls.from_pretrained(path, dtype=dtype).to(device).eval()


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for value in (eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return ids
