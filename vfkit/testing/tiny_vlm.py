"""Tiny random-weight vision-language models (LLaVA layout) with a processor, built offline.

Tests of image mechanics (serving, LoRA on the language model, training) use these instead of
downloaded VLMs:

    path = make_tiny_vlm("/tmp/tiny-vlm")    # config, weights, tokenizer, image processor
    AutoModelForImageTextToText.from_pretrained(path); AutoProcessor.from_pretrained(path)
    make_tiny_idefics3("/tmp/tiny-idefics3")  # SmolVLM's architecture: 5-D pixel_values

The language model is a tiny Llama over the byte tokenizer of `tiny_model`, plus one `<image>`
token; the vision tower is a one-layer CLIP on 32×32 images (8×8 patches: 16 image tokens per
image). Every image, whatever its size, is resized and centre-cropped to 32×32.
"""

from __future__ import annotations

import json
from pathlib import Path

from vfkit.testing.tiny_model import SPECIAL_TOKENS, TOOL_CALLS, make_tokenizer

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH_SIZE) ** 2

# ChatML over OpenAI-style content parts: an image part becomes one <image> placeholder, which
# the processor expands to IMAGE_TOKENS_PER_IMAGE tokens; tool results render as user turns.
CHAT_TEMPLATE = (
    "{% macro render(content) %}{% if content is string %}{{ content }}"
    "{% else %}{% for part in content %}"
    "{% if part.type in ('image', 'image_url') %}<image>"
    "{% elif part.type == 'text' %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}{% endmacro %}"
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n'
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ render(message.content) }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n"
    "{% if message.content %}{{ render(message.content) }}{% endif %}"
    + TOOL_CALLS
    + "<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_vlm_processor():
    """A LlavaProcessor: the byte tokenizer + `<image>`, a PIL CLIP image processor at 32 px."""
    from transformers import LlavaProcessor

    try:  # transformers 5.x names the PIL processor apart; in 4.x it is CLIPImageProcessor
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    except ImportError:
        from transformers import CLIPImageProcessor as CLIPImageProcessorPil

    tokenizer = make_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS, IMAGE_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's class token, dropped by the "default" strategy
    )


def make_tiny_vlm(
    path: str | Path, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0
) -> Path:
    """Write a tiny LLaVA with random weights and its processor to `path` (reused if there)."""
    import torch
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    path = Path(path)
    spec = {"kind": "llava", "hidden": hidden_size, "layers": num_layers, "seed": seed}
    marker = path / "tiny_vlm.json"
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return path
    processor = make_vlm_processor()
    tokenizer = processor.tokenizer
    config = LlavaConfig(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 2,
            "num_hidden_layers": num_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
            "projection_dim": 32,
        },
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    marker.write_text(json.dumps(spec))
    return path


IDEFICS3_IMAGE_SEQ_LEN = 4  # (32 / 8)^2 patches, merged 2x2 by the connector (scale_factor 2)


def make_tiny_idefics3(path: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random Idefics3 (SmolVLM's architecture) and its processor to `path`.

    No image splitting, 32 px images, IDEFICS3_IMAGE_SEQ_LEN tokens per image; its processor
    returns per-prompt image stacks (pixel_values B x N x C x H x W, pixel_attention_mask).
    """
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    path = Path(path)
    marker = path / "tiny_vlm.json"
    spec = {"kind": "idefics3", "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return path
    tokenizer = make_tokenizer()
    extra = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS, *extra]})
    edge = {"longest_edge": IMAGE_SIZE}
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(
            do_image_splitting=False, size=edge, max_image_size=edge
        ),
        tokenizer=tokenizer, image_seq_len=IDEFICS3_IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    config = Idefics3Config(
        text_config={
            "model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 512,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": IMAGE_SIZE,
                       "patch_size": PATCH_SIZE},
        scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    path.mkdir(parents=True, exist_ok=True)
    Idefics3ForConditionalGeneration(config).save_pretrained(path)
    processor.save_pretrained(path)
    marker.write_text(json.dumps(spec))
    return path
