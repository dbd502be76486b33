"""vf-serve's `POST /inference/v1/generate` (vLLM's token-in route, what prime-rl's train client
calls) over real HTTP through the openai client, as that client sends it, with a tiny random
model in fp32: sampled ids and their logprobs are checked against a direct forward pass."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL = "tiny"


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_path) -> list[int]:
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    return tok.apply_chat_template([{"role": "user", "content": "Say something."}],
                                   add_generation_prompt=True, tokenize=True, return_dict=False)


def post(client: openai.OpenAI, body: dict) -> dict:
    """As the renderers client posts it: the route sits at the server root, not under /v1."""
    url = str(client.base_url).rstrip("/").removesuffix("/v1") + "/inference/v1/generate"
    return client.post(url, cast_to=httpx.Response, body=body).json()


def refused(client: openai.OpenAI, body: dict) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        post(client, body)
    return info.value


def test_token_ids_in_token_ids_and_their_logprobs_out(client, prompt_ids, tiny_model_path):
    body = {"model": MODEL, "token_ids": prompt_ids, "stream": False, "cache_salt": "s",
            "sampling_params": {"max_tokens": 8, "temperature": 1.0, "logprobs": 1, "seed": 7,
                                "skip_special_tokens": False, "detokenize": False}}
    out = post(client, body)
    (choice,) = out["choices"]
    ids = choice["token_ids"]
    assert out["prompt_token_ids"] == prompt_ids and 1 <= len(ids) <= 8
    assert choice["finish_reason"] in ("stop", "length")
    assert out["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                            "total_tokens": len(prompt_ids) + len(ids)}
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in ids]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert [e["logprob"] for e in content] == pytest.approx(expected.tolist(), abs=1e-4)
    assert all(len(e["top_logprobs"]) == 1 for e in content)
    assert post(client, body)["choices"][0]["token_ids"] == ids  # seeded: the same draw


def test_n_samples_and_no_logprobs_unless_asked(client, prompt_ids):
    out = post(client, {"token_ids": prompt_ids,
                        "sampling_params": {"max_tokens": 6, "n": 3, "seed": 1}})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert all(c["logprobs"] is None for c in out["choices"])
    assert len({tuple(c["token_ids"]) for c in out["choices"]}) > 1  # seed + k each


def test_greedy_stops_at_max_tokens(client, prompt_ids):
    out = post(client, {"token_ids": prompt_ids, "sampling_params":
                        {"max_tokens": 5, "temperature": 0, "ignore_eos": True}})
    (choice,) = out["choices"]
    assert len(choice["token_ids"]) == 5 and choice["finish_reason"] == "length"


@pytest.mark.parametrize(("body", "status", "named"), [
    ({"token_ids": [1, 10**9]}, 400, "token_ids[1]"),
    ({"token_ids": []}, 400, "token_ids"),
    ({"token_ids": [1], "sampling_params": {"temperature": -1}}, 400,
     "sampling_params.temperature"),
    ({"token_ids": [1], "sampling_params": {"min_tokens": 4}}, 400, "min_tokens"),
    ({"token_ids": [1], "sampling_params": {"prompt": "x"}}, 400, "sampling_params.prompt"),
    ({"token_ids": [1], "stream": True}, 400, "stream"),
    ({"token_ids": [1], "features": {"mm_hashes": {"image": ["h"]}}}, 400, "features"),
    ({"token_ids": [1], "sampling_params": {"max_tokens": 10**6}}, 400, "maximum context length"),
    ({"token_ids": [1], "model": "no-such-adapter"}, 404, "no-such-adapter"),
])
def test_client_mistakes_are_4xx_naming_the_field(client, body, status, named):
    error = refused(client, body)
    assert error.status_code == status
    assert named in str(error.body) or named in (error.body or {}).get("param", "")
