"""Vision inputs for a sequence: a chat request's images -> prompt ids + the processor's tensors.

An image-text-to-text model is served with its transformers processor. A chat request's image
parts (`{"type": "image_url", "image_url": {"url": ...}}`, read by `vfkit.images`) are decoded,
the messages are rendered by the chat template with one placeholder per image, and the processor
expands each placeholder into the model's image tokens and computes the vision tensors
(`pixel_values`, `image_grid_thw`, ...). The prompt ids the client gets back include those image
tokens; the tensors travel with the sequence (`Sequence.vision`) to its prefill, where
`VisionPrefill` moves them onto the model's device and, for models with multimodal rotary
positions (Qwen2/2.5/3-VL: `model.model.get_rope_index`), computes the 3-D positions and the
offset that the row's decode positions keep.

Rendering and image decoding are blocking work: the app runs `vision_prompt` off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vfkit.images import ImageError, iter_image_parts, load_image
from vfkit.serve.errors import APIError
from vfkit.serve.prompts import check_text_fits, render_chat
from vfkit.serve.protocol import ChatRequest, chat_messages

_TEXT_KEYS = ("input_ids", "attention_mask")  # the processor's outputs that are not vision inputs


@dataclass(frozen=True)
class MediaPolicy:
    """Where images may come from and how many one prompt may carry (vLLM's flags)."""

    allowed_local_dirs: tuple[str, ...] = ()  # --allowed-local-media-path (empty: data URLs only)
    max_images: int = 8  # --limit-mm-per-prompt '{"image": N}'


@dataclass(frozen=True)
class VisionInputs:
    """The processor's vision tensors for one prompt (on the CPU until its prefill)."""

    tensors: dict[str, Any]  # pixel_values, image_grid_thw, mm_token_type_ids, ...
    num_images: int


def request_images(messages: list[dict[str, Any]], policy: MediaPolicy) -> list[Any]:
    """The request's images as PIL images, in prompt order; 400 naming the part that is wrong."""
    parts = list(iter_image_parts(messages))
    if len(parts) > policy.max_images:
        i, j, _ = parts[policy.max_images]
        raise APIError(
            400,
            f"messages[{i}].content[{j}]: the prompt carries {len(parts)} images, more than the "
            f"{policy.max_images} this server accepts per prompt; send fewer images or restart "
            "the server with a larger --limit-mm-per-prompt '{\"image\": N}'.",
            param=f"messages[{i}].content[{j}]",
        )
    from PIL.Image import DecompressionBombError

    images = []
    for i, j, url in parts:
        try:
            images.append(load_image(url, allowed_local_dirs=policy.allowed_local_dirs))
        except (ImageError, DecompressionBombError) as exc:  # the latter: > 178M pixels
            raise APIError(
                400, f"messages[{i}].content[{j}]: {exc}", param=f"messages[{i}].content[{j}]"
            ) from exc
    return images


def refuse_placeholder_text(messages: list[dict[str, Any]], placeholder: str | None) -> None:
    """400 naming the text part that holds the model's image placeholder as plain text (e.g. a
    model that wrote "<image>"): the processor would count it as an image and refuse the prompt
    with a message naming no part."""
    if not placeholder:
        return
    for i, message in enumerate(messages):
        content = message.get("content")
        parts = [content] if isinstance(content, str) else content or []
        for j, part in enumerate(parts):
            text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) \
                else None
            if isinstance(text, str) and placeholder in text:
                where = f"messages[{i}].content" + ("" if isinstance(content, str) else f"[{j}]")
                raise APIError(
                    400, f"{where}: the text contains {placeholder!r}, this model's image "
                    "placeholder, which would stand for an image; remove it or write it "
                    "differently", param=where,
                )


def vision_prompt(
    processor: Any,
    req: ChatRequest,
    max_model_len: int,
    *,
    trust_templates: bool,
    policy: MediaPolicy,
) -> tuple[list[int], VisionInputs | None]:
    """Prompt ids (image tokens expanded) and vision inputs of a chat request (blocking)."""
    images = request_images(req.messages, policy)
    refuse_placeholder_text(req.messages, getattr(processor, "image_token", None))
    messages = chat_messages(req.messages, images="keep")
    text = render_chat(
        processor.tokenizer, messages, req, trust_templates=trust_templates,
        default_template=getattr(processor, "chat_template", None),
    )  # fmt: skip
    check_text_fits(processor.tokenizer, text, max_model_len)
    try:
        out = processor(
            text=[text], images=images or None, return_tensors="pt", add_special_tokens=False
        )
    except ValueError as exc:  # e.g. the template rendered fewer placeholders than images
        raise APIError(
            400, f"The processor cannot prepare the prompt: {exc}", param="messages"
        ) from exc
    except MemoryError as exc:  # refused image sizes aside, a processor may still blow up
        raise APIError(
            400, "The processor ran out of memory preparing the prompt's images; send smaller "
            "images", param="messages",
        ) from exc
    ids = out["input_ids"][0].tolist()
    if not images:
        return ids, None
    tensors = {k: v for k, v in out.items() if k not in _TEXT_KEYS}
    return ids, VisionInputs(tensors, len(images))


class VisionPrefill:
    """The model side: vision tensors onto the model's device, and multimodal rope positions."""

    def __init__(self, model: Any) -> None:
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        inner = getattr(model, "model", None)
        # Qwen2/2.5/3-VL: 3-D (temporal, height, width) positions for image tokens
        self.rope_index = getattr(inner, "get_rope_index", None)
        self.image_token_id = getattr(model.config, "image_token_id", None)

    def forward_inputs(self, vision: VisionInputs, copies: int = 1) -> dict[str, Any]:
        """The tensors the model's forward takes with `copies` rows of one prompt, on its device
        (floats in its dtype). Every vision tensor lists images (or patches, or prompt rows)
        along dim 0 in prompt order, so `copies` rows are `copies` concatenations."""
        out = {}
        for key, value in self._repeated(vision, copies).items():
            if key != "mm_token_type_ids":  # only for the rope index, computed here
                out[key] = value.to(self.dtype) if value.is_floating_point() else value
        return out

    def positions(self, vision: VisionInputs, ids_BL: Any, mask_BL: Any) -> tuple[Any, Any]:
        """(position ids for the prefill, position of each row's next token [B]) for rows that
        are copies of one unpadded prompt.

        Standard 1-D positions for LLaVA/Idefics3-like models; with multimodal rope, the 3-D
        positions [3, B, L], and the next token sits at `L + delta` (delta < 0 when an image's
        tokens take fewer positions than tokens), where every decode step continues.
        """
        import torch

        rows, length = ids_BL.shape
        plain = torch.arange(length).expand(rows, length)
        if self.rope_index is None or "image_grid_thw" not in vision.tensors:
            return plain, torch.full((rows,), length)
        tensors = self._repeated(vision, rows)
        types = tensors.get("mm_token_type_ids")
        if types is None:
            types = (ids_BL == self.image_token_id).int().to(self.device)
        positions_3BL, deltas = self.rope_index(
            input_ids=ids_BL.to(self.device),
            mm_token_type_ids=types,
            image_grid_thw=tensors["image_grid_thw"],
            attention_mask=mask_BL.to(self.device),
        )
        return positions_3BL, length + deltas.reshape(-1).cpu()

    def _repeated(self, vision: VisionInputs, copies: int) -> dict[str, Any]:
        import torch

        return {k: torch.cat([v] * copies).to(self.device) for k, v in vision.tensors.items()}
