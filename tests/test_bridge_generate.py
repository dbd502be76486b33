"""The test server's vLLM token-in route, as prime-rl's renderer client (verifiers' train client)
calls it: `POST /inference/v1/generate {token_ids, sampling_params}`."""

from __future__ import annotations

import httpx

from vfkit.testing.test_server import TestServer
from vfkit.testing.tiny_model import make_tokenizer


def test_generate_returns_sampled_ids_and_per_token_logprobs() -> None:
    tok = make_tokenizer()
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    seen = []
    with TestServer(lambda req: seen.append(req["prompt"]) or "ok") as server:
        root = server.base_url.removesuffix("/v1")
        body = {"model": "m", "token_ids": prompt,
                "sampling_params": {"max_tokens": 8, "stop_token_ids": [tok.eos_token_id],
                                    "logprobs": 1}}
        resp = httpx.post(f"{root}/inference/v1/generate", json=body).json()
        cut = httpx.post(f"{root}/inference/v1/generate",
                         json={**body, "sampling_params": {"max_tokens": 1}}).json()
    assert seen[0] == tok.decode(prompt)  # the responder sees the decoded prompt
    choice = resp["choices"][0]
    ids = [*tok.encode("ok"), tok.eos_token_id]  # "o", "k", then eos: generation stopped
    assert choice["token_ids"] == ids and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["content"] == [{"token": f"token_id:{t}", "logprob": -0.5}
                                             for t in ids]
    assert resp["prompt_token_ids"] == prompt
    assert cut["choices"][0]["token_ids"] == ids[:1]
    assert cut["choices"][0]["finish_reason"] == "length"
