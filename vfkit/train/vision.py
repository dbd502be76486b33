"""The image side of a vision-language policy: the processor's inputs for each trained sequence.

The server already expanded each image into its placeholder tokens in the prompt ids it returned;
the trainer never re-renders text. What it adds is what the model's forward needs besides the
ids: the processor's vision tensors (pixel_values, image_sizes / image_grid_thw, ...) for the
images of each sequence, in prompt order, built from the image URLs saved with the rollout.

    images = ImageInputs(load_processor(model_dir))   # a VLM's processor (not a tokenizer)
    encoded = images.encode(urls)                      # tensors + how many placeholders they fill
    vision = images.collate([encoded.tensors, ...])    # one micro-batch: concatenated on dim 0
    vision |= images.token_inputs(input_ids_BT)        # per-token extras (Qwen-VL's M-RoPE types)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vfkit.hub import check_vlm_support
from vfkit.images import IMAGE_PART_TYPES, load_image, part_url

# processor outputs that describe the text, not the images: the trainer has its own ids
_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


def is_vlm(config: Any) -> bool:
    """Whether a model config is a vision-language model (it has a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def load_processor(model_dir: str | Path) -> Any:
    """The model's processor when it is a VLM (AutoProcessor), else its tokenizer."""
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    if is_vlm(AutoConfig.from_pretrained(model_dir)):
        check_vlm_support(model_dir)
        return AutoProcessor.from_pretrained(model_dir)
    return AutoTokenizer.from_pretrained(model_dir)



def text_tokenizer(processor: Any) -> Any:
    """The tokenizer inside a processor (or the tokenizer itself)."""
    return getattr(processor, "tokenizer", processor)


def allowed_media_dirs(cfg: Any) -> list[str]:
    """Folders `file://` image URLs may name: the server's own --allowed-local-media-path
    (inference.args.allowed_local_media_path), so trainer and server read the same images."""
    args = {k.replace("-", "_"): v for k, v in cfg.inference.args.items()}
    value = args.get("allowed_local_media_path") or []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def is_image_processor(processor: Any) -> bool:
    return getattr(processor, "image_processor", None) is not None


@dataclass
class EncodedImages:
    """A sequence's images as the model takes them, and how many placeholder tokens they fill."""

    tensors: dict[str, torch.Tensor]
    num_tokens: int


class ImageInputs:
    """Turns image URLs into a VLM's vision inputs, with the processor of the served model.

    `allowed_local_dirs`: folders that `file://` image URLs may name (data URLs always work).
    """

    def __init__(self, processor: Any, allowed_local_dirs: Iterable[str | Path] = ()) -> None:
        if not is_image_processor(processor):
            raise ValueError(f"{type(processor).__name__} has no image processor")
        self.processor = processor
        self.image_token = processor.image_token
        self.image_token_id = int(processor.image_token_id)
        self.allowed_local_dirs = tuple(allowed_local_dirs)

    def load(self, urls: list[str]) -> list[Any]:
        """The PIL images the URLs name (ImageError says which one cannot be read)."""
        return [load_image(url, allowed_local_dirs=self.allowed_local_dirs) for url in urls]

    def encode(self, urls: list[str]) -> EncodedImages:
        """The processor's tensors for these images, and the placeholder tokens they expand to.

        The count comes from the processor itself: it expands one image token per image, exactly
        as the server's chat template did, so a rollout whose ids disagree is corrupt.
        """
        if not urls:
            return EncodedImages({}, 0)
        out = self.processor(
            text=[self.image_token * len(urls)], images=self.load(urls), return_tensors="pt"
        )
        num_tokens = int((out["input_ids"] == self.image_token_id).sum())
        tensors = {k: v for k, v in out.items() if k not in _TEXT_KEYS and torch.is_tensor(v)}
        return EncodedImages(tensors, num_tokens)

    def collate(self, encoded: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """One micro-batch's vision inputs: each key concatenated on dim 0, in sample order
        (the model fills the batch's image tokens with image features in that same order).

        Idefics3/SmolVLM-style processors give each prompt a stack of images (pixel_values
        1 x N x C x H x W, pixel_attention_mask 1 x N x H x W): stacks of different N are
        zero-padded to the longest, and the model drops all-zero padding images itself.
        """
        keys = sorted({k for tensors in encoded for k in tensors})
        out = {}
        for k in keys:
            parts = [t[k] for t in encoded if k in t]
            if _per_prompt_stack(k, parts[0]):
                parts = _pad_dim1(parts)
            out[k] = torch.cat(parts)
        return out

    def token_inputs(self, input_ids_BT: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-token inputs some VLMs need beside the ids (Qwen-VL: mm_token_type_ids)."""
        if "mm_token_type_ids" not in getattr(self.processor, "model_input_names", ()):
            return {}
        types = self.processor.create_mm_token_type_ids(input_ids_BT.tolist())
        return {"mm_token_type_ids": torch.tensor(types, dtype=torch.long)}

    def prompt_images(self, messages: list[dict[str, Any]]) -> list[Any]:
        """A prompt's images in order: URL parts loaded, PIL images (dataset rows) as they are."""
        images = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else []:
                if part_url(part) is not None:
                    images.append(self.load([part_url(part)])[0])
                elif isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                    value = part.get(part["type"])
                    if hasattr(value, "convert"):
                        images.append(value.convert("RGB"))
        return images

    def prompt_length(self, messages: list[dict[str, Any]]) -> int:
        """Tokens of a chat prompt as the server renders it, image placeholders expanded."""
        # copies of the messages: transformers 5.17's ProcessorMixin.apply_chat_template sets
        # each caller's message["content"] to new parts, image_url ones as {"type": "image",
        # "url": ...}, which neither part_url nor a server reads, and dataset_rows sends these
        # very prompts (5.24 copies the messages first, in _normalize_chat_messages)
        text = self.processor.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        images = self.prompt_images(messages) or None
        out = self.processor(text=[text], images=images, add_special_tokens=False)
        return len(out["input_ids"][0])



def _per_prompt_stack(key: str, tensor: torch.Tensor) -> bool:
    """Is this input one image stack per prompt (Idefics3: dim 0 prompts, dim 1 images)?"""
    return (key == "pixel_values" and tensor.dim() == 5) or key == "pixel_attention_mask"


def _pad_dim1(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Zero-pad each tensor's dim 1 to the longest (padding images are all zeros)."""
    longest = max(p.shape[1] for p in parts)
    padded = []
    for p in parts:
        pad = p.new_zeros((p.shape[0], longest - p.shape[1], *p.shape[2:]))
        padded.append(torch.cat([p, pad], dim=1))
    return padded
