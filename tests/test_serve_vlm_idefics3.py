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
from vfkit.testing.tiny_vlm import IDEFICS3_IMAGE_SEQ_LEN as IMAGE_SEQ_LEN
from vfkit.testing.tiny_vlm import make_tiny_idefics3


@pytest.fixture(scope="module")
def idefics3_path(tmp_path_factory):
    return make_tiny_idefics3(tmp_path_factory.mktemp("tiny-idefics3"))


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
