"""vf-serve with an image-text-to-text model (a tiny random LLaVA): image prompts over HTTP.

Server logprobs are checked against a direct forward of the same model with its processor
(`hf`), so what the server computes is what the model computes with the image in place.
"""

from __future__ import annotations

import os

import httpx
import openai
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from vfkit.images import image_part
from vfkit.lora_fingerprint import fingerprint_dir
from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer
from vfkit.testing.tiny_vlm import IMAGE_TOKEN, IMAGE_TOKENS_PER_IMAGE

RED, BLUE = (230, 20, 20), (20, 20, 230)


def picture(color, size=40):
    """A flat image with a bright square in one corner (not uniform, as real images)."""
    img = Image.new("RGB", (size, size), color)
    img.paste((255, 255, 255), (0, 0, size // 3, size // 3))
    return img


def user(*parts):
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p}
                                        for p in parts]}  # fmt: skip


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A folder the server may read images from, and one it may not."""
    allowed, outside = tmp_path_factory.mktemp("media"), tmp_path_factory.mktemp("elsewhere")
    picture(RED).save(allowed / "red.png")
    picture(RED).save(outside / "red.png")
    return allowed, outside


@pytest.fixture(scope="module")
def server(vlm_path, media, tmp_path_factory):
    adapters = tmp_path_factory.getbasetemp()
    config = ServeConfig(
        str(vlm_path), served_model_name="vlm", dtype="float32", device="cpu", threads=1,
        allowed_local_media_path=str(media[0]), limit_mm_per_prompt={"image": 3},
        allowed_adapter_dirs=(str(adapters),), max_lora_rank=8,
    )  # fmt: skip
    with BackgroundServer(config) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def hf(vlm_path):
    processor = AutoProcessor.from_pretrained(vlm_path)
    model = AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32).eval()
    return processor, model


def ask(client, messages, model="vlm", **kwargs):
    """A sampled completion with its token ids and logprobs (the trainer's request)."""
    body = {"return_token_ids": True}
    body.update(kwargs.pop("extra_body", {}))
    response = client.chat.completions.create(
        model=model, messages=messages, max_tokens=kwargs.pop("max_tokens", 6), logprobs=True,
        temperature=1.0, seed=7, extra_body=body, **kwargs,
    )  # fmt: skip
    data = response.model_dump()
    choice = data["choices"][0]
    return data["prompt_token_ids"], choice["token_ids"], [
        t["logprob"] for t in choice["logprobs"]["content"]
    ]


@torch.inference_mode()
def hf_logprobs(hf, messages, images, completion, model=None, tools=None):
    """(prompt ids, logprobs of `completion`) from the processor and one forward of the model."""
    processor, base = hf
    text = processor.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    inputs = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
    prompt = inputs["input_ids"][0].tolist()
    ids = torch.tensor([prompt + completion])
    pixels = {"pixel_values": inputs["pixel_values"]} if images else {}
    logits = (model or base)(input_ids=ids, **pixels).logits[0]
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1)
    return prompt, logprobs.gather(1, torch.tensor(completion)[:, None])[:, 0]


def image_token_count(hf, ids):
    return ids.count(hf[0].tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))


def test_image_prompt_logprobs_equal_the_models_forward_and_depend_on_the_image(client, hf):
    results = {}
    for name, color in (("red", RED), ("blue", BLUE)):
        messages = [user("What colour is this?", image_part(picture(color)))]
        prompt, completion, logprobs = ask(client, messages)
        want_prompt, want = hf_logprobs(hf, messages, [picture(color)], completion)
        assert prompt == want_prompt
        assert image_token_count(hf, prompt) == IMAGE_TOKENS_PER_IMAGE  # placeholders expanded
        torch.testing.assert_close(torch.tensor(logprobs), want, atol=1e-4, rtol=0)
        results[name] = (prompt, completion, logprobs)
    # the same text and completion scored under the other image: the model sees the picture
    red_prompt, red_completion, red_logprobs = results["red"]
    assert results["blue"][0] == red_prompt  # same ids: only the pixels differ
    _, under_blue = hf_logprobs(hf, [user("What colour is this?", image_part(picture(BLUE)))],
                                [picture(BLUE)], red_completion)  # fmt: skip
    assert (under_blue - torch.tensor(red_logprobs)).abs().max() > 1e-3


def test_n_samples_of_an_image_prompt(client, hf):
    messages = [user("Describe", image_part(picture(BLUE)))]
    response = client.chat.completions.create(
        model="vlm", messages=messages, max_tokens=5, logprobs=True, temperature=1.0, seed=3, n=3,
        extra_body={"return_token_ids": True},
    ).model_dump()  # fmt: skip
    paths = {tuple(c["token_ids"]) for c in response["choices"]}
    assert len(paths) > 1  # sampled independently
    for choice in response["choices"]:
        _, want = hf_logprobs(hf, messages, [picture(BLUE)], choice["token_ids"])
        got = torch.tensor([t["logprob"] for t in choice["logprobs"]["content"]])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


async def test_image_and_text_requests_served_together(server, hf):
    """Concurrent image and text prompts share decode steps; each still matches the model."""
    import asyncio

    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    conversations = [
        ([user("First", image_part(picture(RED)))], [picture(RED)]),
        ([user("hello there, a longer text-only prompt")], None),
        ([user("Second", image_part(picture(BLUE, size=50)))], [picture(BLUE, size=50)]),
        ([user("short")], None),
    ]

    async def one(messages):
        response = await client.chat.completions.create(
            model="vlm", messages=messages, max_tokens=8, logprobs=True, temperature=1.0,
            seed=11, extra_body={"return_token_ids": True},
        )  # fmt: skip
        choice = response.model_dump()["choices"][0]
        return choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]]

    results = await asyncio.gather(*(one(m) for m, _ in conversations))
    for (messages, images), (completion, logprobs) in zip(conversations, results, strict=True):
        _, want = hf_logprobs(hf, messages, images, completion)
        torch.testing.assert_close(torch.tensor(logprobs), want, atol=1e-4, rtol=0)


def test_several_images_and_an_image_in_a_tool_result(client, hf):
    tools = [{"type": "function", "function": {
        "name": "zoom", "description": "Zoom in.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    }}]  # fmt: skip
    call = {"id": "c1", "type": "function", "function": {"name": "zoom", "arguments": '{"x": 1}'}}
    messages = [
        user("Compare", image_part(picture(RED)), "with", image_part(picture(BLUE, size=64))),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1",
         "content": [{"type": "text", "text": "crop:"}, image_part(picture(BLUE, size=20))]},
    ]  # fmt: skip
    prompt, completion, logprobs = ask(client, messages, tools=tools)
    assert image_token_count(hf, prompt) == 3 * IMAGE_TOKENS_PER_IMAGE
    hf_messages = [*messages[:1], {**messages[1], "tool_calls": [
        {**call, "function": {"name": "zoom", "arguments": {"x": 1}}}]}, messages[2]]  # fmt: skip
    images = [picture(RED), picture(BLUE, size=64), picture(BLUE, size=20)]
    want_prompt, want = hf_logprobs(hf, hf_messages, images, completion, tools=tools)
    assert prompt == want_prompt
    torch.testing.assert_close(torch.tensor(logprobs), want, atol=1e-4, rtol=0)


def test_streaming_with_an_image_gives_the_same_tokens(client):
    messages = [user("Name the colour.", image_part(picture(RED)))]
    prompt, completion, logprobs = ask(client, messages, max_tokens=5)
    stream = client.chat.completions.create(
        model="vlm", messages=messages, max_tokens=5, logprobs=True, temperature=1.0, seed=7,
        stream=True, extra_body={"return_token_ids": True},
    )  # fmt: skip
    ids, lps, prompt_ids = [], [], None
    for chunk in stream:
        data = chunk.model_dump()
        prompt_ids = data.get("prompt_token_ids") or prompt_ids
        for choice in data["choices"]:
            ids += choice.get("token_ids") or []
            lps += [t["logprob"] for t in (choice.get("logprobs") or {}).get("content") or []]
    assert prompt_ids == prompt
    assert ids == completion
    assert lps == pytest.approx(logprobs, abs=1e-5)


def test_local_image_file_inside_the_allowed_folder(client, hf, media):
    path = media[0] / "red.png"
    for url in (f"file://{path}", str(path)):
        messages = [user("What colour?", {"type": "image_url", "image_url": {"url": url}})]
        _, completion, logprobs = ask(client, messages)
        _, want = hf_logprobs(hf, messages, [Image.open(path).convert("RGB")], completion)
        torch.testing.assert_close(torch.tensor(logprobs), want, atol=1e-4, rtol=0)


def bad_image(url):
    return {"type": "image_url", "image_url": {"url": url}}


def assert_400(client, messages, param, *words):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="vlm", messages=messages, max_tokens=2)
    error = caught.value.body
    assert error["param"] == param, error
    for word in words:
        assert word in error["message"], error["message"]


def test_bad_image_parts_are_400s_naming_the_part(client, media):
    ok = image_part(picture(RED))
    cases = [
        ([user("x", bad_image("data:image/png;base64,@@@"))], "invalid base64"),
        ([user("x", bad_image("data:image/png;base64,aGVsbG8="))], "not a readable image"),
        ([user("x", bad_image("data:image/png,raw"))], "base64"),
        ([user("x", bad_image(str(media[1] / "red.png")))], "allowed-local-media-path"),
        ([user("x", bad_image(f"file://{media[1]}/red.png"))], "outside the allowed"),
        ([user("x", bad_image("https://example.com/cat.png"))], "not fetched"),
        ([user("x", {"type": "image_url", "image_url": {}})], "image_url"),
        ([user("x", {"type": "text", "text": ["not", "a", "string"]})], "must be a string"),
        ([user("x", image_part(Image.new("1", (14000, 13000))))], "exceeds limit"),  # 22 kB PNG
        # 274 bytes that a processor scaling the short side up made into gigabytes
        ([user("x", image_part(Image.new("L", (1_000_000, 1))))], "more than 200 times longer"),
        ([user("x", bad_image(str(media[0] / "fifo.png")))], "not a regular file"),  # no hang
    ]
    os.mkfifo(media[0] / "fifo.png")
    for messages, words in cases:
        assert_400(client, messages, "messages[0].content[1]", words)
    # in a later message: the index says which
    tool = {"role": "tool", "tool_call_id": "c", "content": [bad_image("http://x/y.png")]}
    assert_400(client, [user("x", ok), {"role": "assistant", "content": "z"}, tool],
               "messages[2].content[0]", "not fetched")  # fmt: skip
    # the model's placeholder written as text (a model may well write "<image>")
    assert_400(client, [user("look: <image> here", ok)], "messages[0].content[0]",
               "image placeholder")  # fmt: skip
    # the fourth image is one too many (--limit-mm-per-prompt '{"image": 3}')
    assert_400(client, [user(ok, ok, "and", ok, ok)], "messages[0].content[4]",
               "4 images", "--limit-mm-per-prompt")  # fmt: skip


def test_token_prompts_refuse_image_placeholders_and_serve_text(server, hf):
    """The token route and /v1/completions take no image features, so an image placeholder id
    in a prompt is a 400 naming it (it used to be served, with no image behind it); a text
    prompt of the same model is served."""
    processor, model = hf
    url = server.base_url.removesuffix("/v1") + "/inference/v1/generate"
    image = model.config.image_token_id
    text = processor.tokenizer("Which colour?")["input_ids"]
    bad = httpx.post(url, json={"model": "vlm", "token_ids": [*text, image]})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == f"token_ids[{len(text)}]"
    good = httpx.post(url, json={"model": "vlm", "token_ids": text,
                                 "sampling_params": {"max_tokens": 3, "temperature": 0}})
    assert good.status_code == 200 and good.json()["choices"][0]["token_ids"]
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    for prompt, param in (([*text, image], f"prompt[{len(text)}]"),
                          ([text, [image, *text]], "prompt[1][0]")):
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="vlm", prompt=prompt, max_tokens=2)
        assert caught.value.body["param"] == param
        assert "image placeholder" in caught.value.body["message"]
    served = client.completions.create(model="vlm", prompt=text, max_tokens=2, temperature=0)
    assert served.choices[0].finish_reason == "length"


def test_image_sent_to_a_text_model_is_a_400(tiny_model_path):
    config = ServeConfig(str(tiny_model_path), dtype="float32", device="cpu", threads=1)
    with BackgroundServer(config) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        messages = [{"role": "system", "content": "s"}, user("look", image_part(picture(RED)))]
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=str(tiny_model_path), messages=messages)
        assert caught.value.body["param"] == "messages[1].content[1]"
        assert "text-only" in caught.value.body["message"]
        # text parts alone still work
        reply = client.chat.completions.create(
            model=str(tiny_model_path), messages=[user("hi", "there")], max_tokens=2,
            extra_body={"ignore_eos": True},  # random weights may sample EOS
        )
        assert reply.choices[0].finish_reason == "length"


async def test_scripted_test_server_takes_image_prompts():
    """TestServer (the app over a scripted engine) has no model: image parts are ignored, not a
    400, so environment tests can script replies to image prompts."""
    from vfkit.testing.scripted_server import TestServer

    with TestServer(["red"]) as srv:
        reply = await srv.client(max_retries=0).chat.completions.create(
            model="m", messages=[user("Colour?", image_part(picture(RED)))]
        )
        assert reply.choices[0].message.content == "red"
        assert srv.requests[0]["messages"][0]["content"][1]["type"] == "image_url"


@pytest.mark.parametrize("keep", [(), ("tokenizer.json", "tokenizer_config.json")])
def test_an_image_model_without_its_processor_is_an_error_naming_the_folder(
    vlm_path, tmp_path, capsys, keep
):
    """Weights alone (or with a tokenizer but no image processor) cannot serve images."""
    import shutil

    from vfkit.cli.serve import main

    folder = tmp_path / "vlm-without-processor"
    folder.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors", *keep):
        shutil.copy(vlm_path / name, folder / name)
    assert main([str(folder), "--device", "cpu", "--threads", "1"]) == 1
    err = capsys.readouterr().err
    assert f"vf-serve: error: {folder} holds an image-text-to-text model but no usable processor" \
        in err  # fmt: skip


def make_language_adapter(vlm_path, out, seed, targets):
    """A random (non-zero) LoRA adapter saved by PEFT from the image model, as the trainer does."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(out)
    return out


def test_language_model_lora_hot_loads_changes_output_and_fingerprint_matches(
    server, client, hf, vlm_path, tiny_model_path, tmp_path_factory
):
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.getbasetemp() / "vlm-adapters"
    adapter = make_language_adapter(
        vlm_path, root / "lm", seed=1, targets=r".*language_model.*\.(q_proj|v_proj|down_proj)"
    )
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    assert all(".language_model." in k for k in saved)  # the vision tower is left alone
    resp = httpx.post(server.base_url + "/load_lora_adapter",
                      json={"lora_name": "lm", "lora_path": str(adapter)}, timeout=60)  # fmt: skip
    assert resp.status_code == 200, resp.text
    assert resp.json()["fingerprint"] == fingerprint_dir(adapter)
    messages = [user("What colour is this?", image_part(picture(RED)))]
    _, tuned_completion, tuned_lps = ask(client, messages, model="lm")
    tuned = PeftModel.from_pretrained(
        AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32), adapter
    ).eval()
    _, want = hf_logprobs(hf, messages, [picture(RED)], tuned_completion, model=tuned)
    torch.testing.assert_close(torch.tensor(tuned_lps), want, atol=1e-4, rtol=0)
    _, base_want = hf_logprobs(hf, messages, [picture(RED)], tuned_completion)
    assert (want - base_want).abs().max() > 1e-3  # the adapter changes the output
    # an adapter trained on a text model's layout names modules this model lacks: refused
    text_model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    text_adapter = root / "text"
    get_peft_model(
        text_model, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    ).save_pretrained(text_adapter)
    body = {"lora_name": "text", "lora_path": str(text_adapter)}
    resp = httpx.post(server.base_url + "/load_lora_adapter", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "lora_path"
    assert "model.layers.0.self_attn.q_proj" in error["message"]
    assert "model.language_model.layers" in error["message"]
