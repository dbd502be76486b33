"""vf-serve with an Idefics3 (SmolVLM's architecture) model: batched 5-D pixel_values and
pixel_attention_mask, over HTTP, equal a direct forward of the model with its processor."""

from __future__ import annotations

import openai
import pytest
import torch
from PIL import Image

from vfkit.images import image_part
from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer

IMAGE_SEQ_LEN = 4  # (32 / 8)^2 patches, merged 2x2 by the connector (scale_factor 2)


@pytest.fixture(scope="module")
def idefics3_path(tmp_path_factory):
    """A tiny random Idefics3 with its processor (no image splitting, 32 px images)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    from vfkit.testing.tiny_model import SPECIAL_TOKENS, make_tokenizer
    from vfkit.testing.tiny_vlm import CHAT_TEMPLATE

    tokenizer = make_tokenizer()
    extra = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS, *extra]})
    edge = {"longest_edge": 32}
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(
            do_image_splitting=False, size=edge, max_image_size=edge
        ),
        tokenizer=tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE,
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
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-idefics3")
    Idefics3ForConditionalGeneration(config).save_pretrained(path)
    processor.save_pretrained(path)
    return path


def test_two_images_n_samples_equal_the_models_forward(idefics3_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    images = [Image.new("RGB", (40, 30), (220, 30, 30)), Image.new("RGB", (20, 36), (0, 90, 200))]
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Which is darker?"}, image_part(images[0]), image_part(images[1]),
    ]}]  # fmt: skip
    config = ServeConfig(str(idefics3_path), dtype="float32", device="cpu", threads=1)
    with BackgroundServer(config) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        response = client.chat.completions.create(
            model=str(idefics3_path), messages=messages, max_tokens=5, logprobs=True,
            temperature=1.0, seed=5, n=2, extra_body={"return_token_ids": True},
        ).model_dump()  # fmt: skip
    processor = AutoProcessor.from_pretrained(idefics3_path)
    model = AutoModelForImageTextToText.from_pretrained(idefics3_path, dtype=torch.float32).eval()
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
    prompt = inputs["input_ids"][0].tolist()
    assert response["prompt_token_ids"] == prompt
    assert prompt.count(model.config.image_token_id) == 2 * IMAGE_SEQ_LEN
    for choice in response["choices"]:
        ids = torch.tensor([prompt + choice["token_ids"]])
        with torch.inference_mode():
            logits = model(
                input_ids=ids, pixel_values=inputs["pixel_values"],
                pixel_attention_mask=inputs["pixel_attention_mask"],
            ).logits[0, len(prompt) - 1 : -1]  # fmt: skip
        want = torch.log_softmax(logits.float(), -1)
        want = want.gather(1, torch.tensor(choice["token_ids"])[:, None])[:, 0]
        got = torch.tensor([t["logprob"] for t in choice["logprobs"]["content"]])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
