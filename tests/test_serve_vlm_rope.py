"""Multimodal rope (Qwen2-VL, Qwen3-VL): engine prefill + batched decode equal the model's forward.

A Qwen-VL request cannot go through the HTTP API on this machine: Qwen-VL processors need
a torchvision video processor, and torchvision does not install next to our CPU torch. The
model and its PIL image processor do, so this test builds the prompt ids by hand (the image pad
token repeated once per merged patch, as the processor would) and drives the engine directly.
"""

from __future__ import annotations

import threading

import pytest
import torch

from vfkit.serve.engine import Engine
from vfkit.serve.lora import LoraManager
from vfkit.serve.sequence import SamplingParams, Sequence
from vfkit.serve.vision import VisionInputs

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
TEXT = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
}  # fmt: skip
# per model: config classes' extra text fields (head_dim 16: mrope sections sum to 8), vision
# config, and the image processor's patch size (a 112 or 128 px image: 8x8 patches)
KINDS = {
    "qwen2_vl": (
        {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
        {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2,
         "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        14,
    ),
    "qwen3_vl": (
        {"head_dim": 16, "rope_parameters": {
            "rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}},
        {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
         "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
         "out_hidden_size": 64, "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
        16,
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=list(KINDS))
def qwen_vl(request):
    """A tiny random Qwen-VL (2 layers) + the byte tokenizer with the vision tokens + patch size."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from vfkit.testing.tiny_model import make_tokenizer

    text_extra, vision_config, patch = KINDS[request.param]
    tokenizer = make_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    start, end, pad = tokenizer.convert_tokens_to_ids(VISION_TOKENS)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    config = AutoConfig.for_model(
        request.param,
        text_config={"vocab_size": len(tokenizer), **TEXT, **text_extra, **ids},
        vision_config=vision_config,
        image_token_id=pad, vision_start_token_id=start, vision_end_token_id=end,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()
    with torch.no_grad():  # sharper attention, so that positions visibly matter
        for layer in model.model.language_model.layers:
            layer.self_attn.q_proj.weight.mul_(30)
            layer.self_attn.k_proj.weight.mul_(30)
    return model, tokenizer, patch


def image_inputs(color, patch):
    """pixel_values and image_grid_thw of one image of 8x8 patches (16 merged tokens)."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    side = 8 * patch
    processor = Qwen2VLImageProcessorPil(
        patch_size=patch, merge_size=2, min_pixels=side * side, max_pixels=side * side
    )
    out = processor(images=[Image.new("RGB", (side, side), color)], return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def run(engine, seqs, timeout=120):
    """Submit sequences, wait until all are done."""
    done = threading.Semaphore(0)
    for seq in seqs:
        seq.on_done = lambda _: done.release()
    engine.submit(seqs)
    for _ in seqs:
        assert done.acquire(timeout=timeout)
    for seq in seqs:
        assert seq.error is None, seq.error


@torch.inference_mode()
def reference_logprobs(model, prompt, completion, vision=None, image_token_id=None, rope=True):
    """Log-probs of `completion` after `prompt`, by one full forward (the model's own rope;
    `rope=False`: plain 1-D positions instead, what a server ignoring mrope would compute)."""
    ids = torch.tensor([prompt + completion])
    extra = {}
    if vision is not None:
        extra = {**vision, "mm_token_type_ids": (ids == image_token_id).int()}
    if not rope:
        extra["position_ids"] = torch.arange(ids.shape[1])[None, :]
    logits = model(input_ids=ids, **extra).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1)


def test_mrope_prefill_and_decode_match_full_forward(qwen_vl):
    model, tokenizer, patch = qwen_vl
    start, end, pad = tokenizer.convert_tokens_to_ids(VISION_TOKENS)
    vision = image_inputs((200, 30, 30), patch)
    assert vision["image_grid_thw"].tolist() == [[1, 8, 8]]
    t, h, w = vision["image_grid_thw"][0].tolist()
    n_image = t * h * w // 4  # 2x2 patches merged into one token: 16
    text = tokenizer.encode("Which colour is it?", add_special_tokens=False)
    image_prompt = [*text[:3], start, *[pad] * n_image, end, *text[3:]]
    text_prompt = tokenizer.encode("a text-only row decoded alongside", add_special_tokens=False)
    engine = Engine(LoraManager(model), tokenizer, max_model_len=512, eos_token_ids=set())
    engine.start()
    try:
        params = SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True, logprobs=5, seed=3)
        shared = VisionInputs(vision, 1)  # a request with n=2: two rows prefilled together
        seqs = [
            Sequence(image_prompt, params, vision=shared, generator=engine.generator(3, 0)),
            Sequence(image_prompt, params, vision=shared, generator=engine.generator(3, 1)),
            Sequence(text_prompt, params, generator=engine.generator(3, 2)),
        ]
        run(engine, seqs)
    finally:
        engine.stop()
    assert (engine.stats.prefills, engine.stats.admitted) == (2, 3)  # image pair, then text
    assert engine.stats.prefill_shared == 1  # the pair's prompt (and image) ran once
    *image_seqs, text_seq = seqs
    assert image_seqs[0].output_ids != image_seqs[1].output_ids  # two samples, two paths
    # image rows take max(h, w) / 2 = 4 positions for 16 tokens: decode continues 12 lower
    for image_seq in image_seqs:
        ref = reference_logprobs(model, image_prompt, image_seq.output_ids, vision, pad)
        want = ref.gather(1, torch.tensor(image_seq.output_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(image_seq.logprobs), want, atol=1e-4, rtol=0)
        for step, top in enumerate(image_seq.top_logprobs):  # the whole distribution
            for token, logprob in top:
                assert abs(logprob - float(ref[step, token])) < 1e-4
    ref_text = reference_logprobs(model, text_prompt, text_seq.output_ids)
    want_text = ref_text.gather(1, torch.tensor(text_seq.output_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(text_seq.logprobs), want_text, atol=1e-4, rtol=0)
    # plain 1-D positions give other numbers: the comparison above would catch them
    plain = reference_logprobs(model, image_prompt, image_seq.output_ids, vision, pad, rope=False)
    plain_lp = plain.gather(1, torch.tensor(image_seq.output_ids)[:, None])[:, 0]
    assert (plain_lp - want).abs().max() > 1e-3
