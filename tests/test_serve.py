"""The embedded server over real HTTP (openai client) with a tiny random model in fp32.

Logprobs and token ids are checked against a direct forward pass of the same weights.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def ref(tiny_model_path):
    """The same weights, run directly: logprobs of `ids[n:]` given `ids[:n]`."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)

    class Ref:
        tok = tokenizer

        @staticmethod
        @torch.inference_mode()
        def logits(prompt_ids, output_ids):
            ids = torch.tensor([prompt_ids + output_ids])
            out = model(ids).logits[0].float()
            return out[len(prompt_ids) - 1 : len(prompt_ids) + len(output_ids) - 1]

        @classmethod
        def logprobs(cls, prompt_ids, output_ids, temperature=1.0):
            lp = torch.log_softmax(cls.logits(prompt_ids, output_ids) / temperature, -1)
            return lp.gather(1, torch.tensor(output_ids)[:, None])[:, 0]

    return Ref


def chat(client, **kwargs):
    args = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "logprobs": True}
    args.update(kwargs)
    extra = {"return_token_ids": True, **args.pop("extra_body", {})}
    return client.chat.completions.create(**args, extra_body=extra)


def sampled(response, choice=0):
    c = response.choices[choice]
    return response.prompt_token_ids, c.token_ids, [e.logprob for e in c.logprobs.content]


def test_health_and_models(tiny_server, client):
    assert httpx.get(tiny_server.base_url[:-3] + "/health").status_code == 200
    (card,) = client.models.list().data
    assert card.id == MODEL
    assert card.model_extra["max_model_len"] == 1024


def test_chat_ids_and_logprobs_match_forward_pass(client, ref):
    response = chat(client, temperature=0.7, max_tokens=16, extra_body={"ignore_eos": True})
    prompt_ids, token_ids, logprobs = sampled(response)
    expected_prompt = ref.tok.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert prompt_ids == expected_prompt
    assert len(token_ids) == len(logprobs) == 16
    want = ref.logprobs(prompt_ids, token_ids, temperature=0.7)
    assert (torch.tensor(logprobs) - want).abs().max() < 1e-3
    c = response.choices[0]
    assert c.finish_reason == "length"
    assert response.usage.completion_tokens == 16
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert c.message.content == ref.tok.decode(token_ids, skip_special_tokens=True)


async def test_concurrent_requests_batch_and_match(tiny_server, ref):
    """Requests of different lengths arrive together and mid-generation; each row stays exact."""
    client = openai.AsyncOpenAI(base_url=tiny_server.base_url, api_key="unused", max_retries=0)

    async def one(i):
        await asyncio.sleep(0.02 * i)  # some join a batch that is already decoding
        messages = [{"role": "user", "content": "x" * (3 + 7 * i)}]
        return await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=5 + 3 * i, logprobs=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )  # fmt: skip

    responses = await asyncio.gather(*(one(i) for i in range(6)))
    for i, r in enumerate(responses):
        prompt_ids, token_ids, logprobs = sampled(r)
        assert len(token_ids) == 5 + 3 * i
        assert (torch.tensor(logprobs) - ref.logprobs(prompt_ids, token_ids)).abs().max() < 1e-3


def test_greedy_is_argmax_and_repeatable(client, ref):
    a = chat(client, temperature=0, extra_body={"ignore_eos": True})
    b = chat(client, temperature=0, extra_body={"ignore_eos": True})
    prompt_ids, token_ids, logprobs = sampled(a)
    assert token_ids == sampled(b)[1]
    assert token_ids == ref.logits(prompt_ids, token_ids).argmax(-1).tolist()
    # greedy reports logprobs of the unscaled distribution
    assert (torch.tensor(logprobs) - ref.logprobs(prompt_ids, token_ids)).abs().max() < 1e-3


def test_seed_makes_sampling_reproducible(client):
    runs = [chat(client, seed=s, max_tokens=20).choices[0].token_ids for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]  # 20 draws from a near-uniform 259-token distribution


@pytest.mark.parametrize(
    "truncation", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}], ids=["top_k", "top_p", "min_p"]
)
def test_truncation_samples_from_the_top_but_reports_untruncated_logprobs(client, ref, truncation):
    """Keeping only the best token makes sampling greedy; logprobs stay those after temperature."""
    r = chat(client, temperature=2.0, seed=1, extra_body={"ignore_eos": True, **truncation})
    prompt_ids, token_ids, logprobs = sampled(r)
    assert token_ids == ref.logits(prompt_ids, token_ids).argmax(-1).tolist()
    want = ref.logprobs(prompt_ids, token_ids, temperature=2.0)
    assert (torch.tensor(logprobs) - want).abs().max() < 1e-3


def _greedy_with_penalty(ref, prompt_ids, steps, penalize):
    """Reference greedy decoding with a penalty rule applied to the logits in the test."""
    out, logprobs = [], []
    for _ in range(steps):
        logits = ref.logits(prompt_ids, [*out, 0])[-1]
        logits = penalize(logits.clone(), prompt_ids, out)
        out.append(int(logits.argmax()))
        logprobs.append(float(torch.log_softmax(logits, -1)[out[-1]]))
    return out, logprobs


@pytest.mark.parametrize(
    ("args", "rule"),
    [
        ({"repetition_penalty": 1.5}, "repetition"),
        ({"presence_penalty": 1.5}, "presence"),
        ({"frequency_penalty": 0.7}, "frequency"),
    ],
)
def test_penalties_follow_their_rules(client, ref, args, rule):
    def penalize(logits, prompt_ids, out):
        if rule == "repetition":  # divide positive, multiply negative logits of seen tokens
            seen = torch.tensor(sorted(set(prompt_ids + out)))
            v = logits[seen]
            logits[seen] = torch.where(v > 0, v / 1.5, v * 1.5)
        for t in set(out):
            if rule == "presence":
                logits[t] -= 1.5
            elif rule == "frequency":
                logits[t] -= 0.7 * out.count(t)
        return logits

    body = {"ignore_eos": True, **{k: v for k, v in args.items() if k == "repetition_penalty"}}
    kwargs = {k: v for k, v in args.items() if k != "repetition_penalty"}
    r = chat(client, temperature=0, max_tokens=10, extra_body=body, **kwargs)
    prompt_ids, token_ids, logprobs = sampled(r)
    want_ids, want_lp = _greedy_with_penalty(ref, prompt_ids, 10, penalize)
    assert token_ids == want_ids
    assert max(abs(a - b) for a, b in zip(logprobs, want_lp, strict=True)) < 1e-3


def test_stop_string_and_stop_token(client):
    base = chat(client, temperature=0, max_tokens=12, extra_body={"ignore_eos": True})
    ids, text = base.choices[0].token_ids, base.choices[0].message.content
    stop = next(ch for ch in text[3:] if ch.isascii() and ch.isalnum())
    r = chat(client, temperature=0, max_tokens=12, stop=[stop], extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert c.message.content == text[: text.index(stop)]
    assert c.token_ids == ids[: len(c.token_ids)]
    body = {"ignore_eos": True, "stop_token_ids": [ids[3]]}
    r = chat(client, temperature=0, max_tokens=12, extra_body=body)
    first = ids.index(ids[3])
    assert r.choices[0].token_ids == ids[: first + 1]  # the stop token is included in token_ids
    assert r.choices[0].finish_reason == "stop"


def test_n_and_top_logprobs(client, ref):
    r = chat(client, n=3, seed=3, top_logprobs=4, max_tokens=6)
    assert len(r.choices) == 3
    assert len({tuple(c.token_ids) for c in r.choices}) == 3
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)
    entry = r.choices[0].logprobs.content[0]
    assert len(entry.top_logprobs) == 4
    tops = [t.logprob for t in entry.top_logprobs]
    assert tops == sorted(tops, reverse=True) and tops[0] >= entry.logprob
    assert entry.bytes == list(entry.token.encode())


def test_equal_prompts_prefill_once_and_sample_as_if_alone(tiny_server, client, ref):
    """n=4 of one prompt: one row's prefill is copied to the other three (GET /stats), and
    each copy samples what a request of its own with its seed samples, exactly scored."""
    stats_url = tiny_server.base_url[: -len("/v1")] + "/stats"
    before = httpx.get(stats_url).json()
    together = chat(client, n=4, seed=11, max_tokens=8, extra_body={"ignore_eos": True})
    after = httpx.get(stats_url).json()
    prompt_ids = together.prompt_token_ids
    assert after["prefill_shared"] - before["prefill_shared"] == 3
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(prompt_ids)
    assert len({tuple(c.token_ids) for c in together.choices}) > 1
    for i, choice in enumerate(together.choices):  # sample i of seed s draws from seed s + i
        alone = chat(client, seed=11 + i, max_tokens=8, extra_body={"ignore_eos": True})
        assert sampled(alone)[1] == choice.token_ids
        want = ref.logprobs(prompt_ids, choice.token_ids)
        got = torch.tensor([e.logprob for e in choice.logprobs.content])
        assert (got - want).abs().max() < 1e-3


def test_completions_prompt_forms(client, ref):
    text = client.completions.create(
        model=MODEL, prompt="hello", max_tokens=4, logprobs=2, temperature=0.5,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )  # fmt: skip
    c = text.choices[0]
    assert c.prompt_token_ids == ref.tok("hello")["input_ids"]
    assert len(c.token_ids) == 4 and len(c.logprobs.tokens) == 4
    # each token's offset is where its text starts (an unseeded sample: its tokens may be
    # special or partial characters, of length 0)
    ends = [sum(len(t) for t in c.logprobs.tokens[:i]) for i in range(4)]
    assert c.logprobs.text_offset == ends
    assert all(1 <= len(d) <= 3 for d in c.logprobs.top_logprobs)  # equal strings collide
    want = ref.logprobs(c.prompt_token_ids, c.token_ids, temperature=0.5)
    assert (torch.tensor(c.logprobs.token_logprobs) - want).abs().max() < 1e-3
    many = client.completions.create(
        model=MODEL, prompt=[[5, 6, 7], [8, 9]], max_tokens=3, n=2,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )  # fmt: skip
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert [c.prompt_token_ids for c in many.choices] == [[5, 6, 7]] * 2 + [[8, 9]] * 2
    assert many.usage.prompt_tokens == 5 and many.usage.completion_tokens == 12


def test_tools_are_rendered_into_the_prompt(client, ref):
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    r = chat(client, tools=[tool], max_tokens=2)
    assert "<tools>" in ref.tok.decode(r.prompt_token_ids) and "lookup" in ref.tok.decode(
        r.prompt_token_ids
    )


async def test_rows_come_and_go_in_a_small_batch(tiny_model_path, ref):
    """3 slots, 14 requests of mixed lengths: finished rows' slots are reused, the batch is
    compacted and widened for a long late prompt; every row stays exact."""
    config = ServeConfig(str(tiny_model_path), dtype="float32", threads=1, max_num_seqs=3)
    with BackgroundServer(config) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0)

        async def one(i):
            await asyncio.sleep(0.01 * i)
            prompt = "y" * (2 + (i * 5) % 17) + ("z" * 60 if i == 11 else "")
            return await client.completions.create(
                model=config.model, prompt=prompt, max_tokens=2 + (i * 7) % 13, logprobs=0,
                extra_body={"return_token_ids": True, "ignore_eos": True},
            )  # fmt: skip

        responses = await asyncio.gather(*(one(i) for i in range(14)))
        for i, r in enumerate(responses):
            c = r.choices[0]
            assert len(c.token_ids) == 2 + (i * 7) % 13
            want = ref.logprobs(c.prompt_token_ids, c.token_ids)
            assert (torch.tensor(c.logprobs.token_logprobs) - want).abs().max() < 1e-3, i
        stats = httpx.get(srv.base_url[: -len("/v1")] + "/stats").json()
        assert stats["finished"] == 14 and stats["running"] == 0
