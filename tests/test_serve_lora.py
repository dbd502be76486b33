"""Runtime LoRA on the embedded server: load, serve, reload in place, mix, unload, refuse."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from vfkit.lora_fingerprint import fingerprint_dir
from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_path, out, seed, rank=4, targets=TARGETS):
    """A LoRA adapter with random (non-zero) A and B, so it visibly changes the model."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False
    )
    get_peft_model(model, config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapters(tiny_model_path, tmp_path_factory):
    allowed = tmp_path_factory.mktemp("adapters")
    outside = tmp_path_factory.mktemp("elsewhere")
    return {
        "allowed": allowed,
        "a": make_adapter(tiny_model_path, allowed / "a", seed=1),
        "b": make_adapter(tiny_model_path, allowed / "b", seed=2),
        "big": make_adapter(tiny_model_path, allowed / "big", seed=3, rank=16),
        "qv": make_adapter(tiny_model_path, allowed / "qv", seed=5, targets=["q_proj", "v_proj"]),
        "outside": make_adapter(tiny_model_path, outside / "c", seed=4),
    }


@pytest.fixture(scope="module")
def server(tiny_model_path, adapters):
    config = ServeConfig(
        str(tiny_model_path), served_model_name="base", dtype="float32", threads=1,
        allowed_adapter_dirs=(str(adapters["allowed"]),), max_lora_rank=8,
    )  # fmt: skip
    with BackgroundServer(config) as srv:
        yield srv


@pytest.fixture(scope="module")
def scorer(tiny_model_path, adapters):
    """Teacher-forced logprobs under the base model or one adapter, computed directly."""
    models = {None: AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)}
    for name in ("a", "b", "qv"):
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        models[name] = PeftModel.from_pretrained(base, adapters[name]).eval()

    @torch.inference_mode()
    def score(which, prompt_ids, token_ids):
        logits = models[which](torch.tensor([prompt_ids + token_ids])).logits[0]
        logits = logits[len(prompt_ids) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(token_ids)[:, None])[:, 0]

    return score


def load(server, name, path, inplace=None):
    body = {"lora_name": name, "lora_path": str(path)}
    if inplace is not None:
        body["load_inplace"] = inplace
    return httpx.post(server.base_url + "/load_lora_adapter", json=body, timeout=30)


def unload(server, name):
    return httpx.post(server.base_url + "/unload_lora_adapter", json={"lora_name": name})


def generate(client, model, content="Hello there"):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=8,
        logprobs=True, extra_body={"return_token_ids": True, "ignore_eos": True},
    )  # fmt: skip
    c = r.choices[0]
    return r.prompt_token_ids, c.token_ids, torch.tensor([e.logprob for e in c.logprobs.content])


def assert_served_by(scorer, which, sample, others=()):
    prompt_ids, token_ids, logprobs = sample
    assert (logprobs - scorer(which, prompt_ids, token_ids)).abs().max() < 1e-3
    for other in others:  # and visibly not by the others
        assert (logprobs - scorer(other, prompt_ids, token_ids)).abs().max() > 1e-2


def test_adapter_lifecycle(server, adapters, scorer):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    r = load(server, "pol", adapters["a"])
    assert r.status_code == 200, r.text
    cards = {m.id: m for m in client.models.list().data}
    assert cards["pol"].model_extra["parent"] == "base"
    assert cards["pol"].model_extra["root"] == str(adapters["a"].resolve())
    assert_served_by(scorer, "a", generate(client, "pol"), others=[None])
    assert_served_by(scorer, None, generate(client, "base"), others=["a"])

    # same name again: refused unless in place, as vLLM does
    assert load(server, "pol", adapters["b"]).status_code == 400
    assert_served_by(scorer, "a", generate(client, "pol"))
    assert load(server, "pol", adapters["b"], inplace=True).status_code == 200
    assert_served_by(scorer, "b", generate(client, "pol"), others=["a", None])

    assert unload(server, "pol").status_code == 200
    with pytest.raises(openai.NotFoundError):
        generate(client, "pol")
    assert unload(server, "pol").status_code == 404
    assert [m.id for m in client.models.list().data] == ["base"]
    assert_served_by(scorer, None, generate(client, "base"))


async def test_one_batch_mixes_adapters(server, adapters, scorer):
    assert load(server, "mix-a", adapters["a"]).status_code == 200
    assert load(server, "mix-b", adapters["b"]).status_code == 200
    assert load(server, "mix-qv", adapters["qv"]).status_code == 200  # a subset of the layers
    assert_served_by(scorer, "b", _sync_generate(server, "mix-b"))  # the newest, alone
    assert_served_by(scorer, "qv", _sync_generate(server, "mix-qv"), others=[None])
    models = ["mix-a", "base", "mix-b", "mix-qv", "mix-a", "base", "mix-b", "mix-qv"]
    samples = await asyncio.gather(*(asyncio.to_thread(_sync_generate, server, m) for m in models))
    for model, sample in zip(models, samples, strict=True):
        which = {"mix-a": "a", "mix-b": "b", "mix-qv": "qv", "base": None}[model]
        assert_served_by(scorer, which, sample)
    assert unload(server, "mix-a").status_code == 200
    assert unload(server, "mix-b").status_code == 200
    assert unload(server, "mix-qv").status_code == 200


def test_merged_and_peft_paths_agree(tiny_model_path, adapters):
    """One-adapter batches run merged weights; PEFT's unmerged path must give the same logits."""
    from vfkit.serve.lora import LoraManager

    outs = {}
    ids = torch.tensor([[1, 5, 9, 14, 2, 7]] * 2)
    for merge in (True, False):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
        lora = LoraManager(model, allowed_dirs=[adapters["allowed"]], merge=merge)
        for name in ("a", "qv"):
            lora.apply_load(name, lora.check_load(name, str(adapters[name]), inplace=False))
        with torch.inference_mode():
            outs[merge] = [
                lora.forward(rows, input_ids=ids).logits
                for rows in (["a", "a"], ["qv", "qv"], [None, None], ["qv", "qv"], ["a", None],
                             ["a", "a"])  # a -> qv direct: qv's variant is built while a's is in
            ]
    for merged, unmerged in zip(outs[True], outs[False], strict=True):
        assert (merged - unmerged).abs().max() < 1e-4
    assert (outs[True][0] - outs[True][1]).abs().max() > 1e-2  # the adapter does change logits


def test_bf16_merging_rounds_a_small_update_away() -> None:
    """Why bf16 adapters are not merged: an update of ~1/200 of W survives PEFT's unmerged bf16
    layer (rounded per token, with the activations) but not a bf16 merge (rounded once, into W)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2048, 64, bias=False))
    torch.nn.init.normal_(net[0].weight, std=0.02)
    peft = get_peft_model(net, LoraConfig(r=4, lora_alpha=8, target_modules=["0"],
                                          init_lora_weights=False))
    layer = peft.base_model.model[0]
    with torch.no_grad():  # |s·B·A| <= 1e-4: below half a bf16 step of most of W's elements
        layer.lora_B["default"].weight.mul_(1e-4 / layer.get_delta_weight("default").abs().max())
        x = torch.randn(1024, 2048)
        want = x @ layer.get_delta_weight("default").T
        peft.to(torch.bfloat16)
        with peft.disable_adapter():
            base = peft(x.bfloat16()).float()
        unmerged = peft(x.bfloat16()).float() - base
        merged = peft.merge_and_unload()(x.bfloat16()).float() - base

    def cos(got: torch.Tensor) -> float:
        return float((got * want).sum() / (got.norm() * want.norm()))

    assert cos(unmerged) > 0.6 and cos(merged) < 0.5  # measured 0.72 and 0.40


@pytest.mark.parametrize(("dtype", "path"), [(torch.float32, "merged"), (torch.bfloat16, "peft")])
def test_one_adapter_batches_merge_only_fp32_weights(tiny_model_path, adapters, dtype, path):
    from vfkit.serve.lora import LoraManager

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=dtype).eval()
    lora = LoraManager(model, allowed_dirs=[adapters["allowed"]])
    lora.apply_load("a", lora.check_load("a", str(adapters["a"]), inplace=False))
    with torch.inference_mode():
        lora.forward(["a", "a"], input_ids=torch.tensor([[1, 5, 9]] * 2))
    assert dict(lora.path_counts) == {path: 1}


def _sync_generate(server, model):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    return generate(client, model)


def test_adapter_refusals(server, adapters):
    r = load(server, "evil", adapters["outside"])
    assert r.status_code == 403
    assert "--allowed-adapter-dir" in r.json()["error"]["message"]
    escape = adapters["allowed"] / ".." / adapters["outside"].parent.name / "c"
    assert load(server, "evil", escape).status_code == 403  # `..` does not get out
    r = load(server, "big", adapters["big"])
    assert r.status_code == 400 and "max_lora_rank 8" in r.json()["error"]["message"]
    assert load(server, "none", adapters["allowed"] / "missing").status_code == 400
    assert unload(server, "never-loaded").status_code == 404


def _cards(server) -> dict[str, dict]:
    models = httpx.get(server.base_url + "/models").json()["data"]
    return {m["id"]: m for m in models}


def test_load_reports_the_fingerprint_of_the_weights_read(server, adapters, tmp_path_factory):
    """The fingerprint is exact: equal to the trainer's of the saved file, new after a reload."""
    r = load(server, "fp", adapters["a"])
    assert r.status_code == 200, r.text
    assert "Success" in r.text  # still reads as vLLM's success answer
    assert r.json()["fingerprint"] == fingerprint_dir(adapters["a"])
    assert _cards(server)["fp"]["fingerprint"] == fingerprint_dir(adapters["a"])
    r = load(server, "fp", adapters["b"], inplace=True)  # other weights, same shapes
    assert r.json()["fingerprint"] == fingerprint_dir(adapters["b"]) != fingerprint_dir(
        adapters["a"]
    )
    assert _cards(server)["fp"]["fingerprint"] == fingerprint_dir(adapters["b"])
    assert unload(server, "fp").status_code == 200


def test_adapter_names_with_dots_load_and_serve(server, adapters, scorer):
    """PEFT module names cannot hold ".": the server maps client names to its own."""
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    for name, which in (("Qwen2.5-0.5B-step1", "a"), ("exp.v2-step3", "b")):
        r = load(server, name, adapters[which])
        assert r.status_code == 200, r.text
        assert_served_by(scorer, which, generate(client, name), others=[None])
    assert load(server, "exp.v2-step3", adapters["a"], inplace=True).status_code == 200
    assert_served_by(scorer, "a", generate(client, "exp.v2-step3"), others=["b"])
    assert unload(server, "Qwen2.5-0.5B-step1").status_code == 200
    assert unload(server, "exp.v2-step3").status_code == 200


@pytest.mark.parametrize("name", ["base", "__base__", ""])
def test_adapter_names_cannot_shadow_the_base_or_reserved_names(server, adapters, name):
    r = load(server, name, adapters["a"])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "lora_name"
    assert name not in _cards(server) or name == "base"


def test_bad_adapter_files_are_400_naming_the_folder(server, adapters, tmp_path):
    import json
    import shutil

    broken = adapters["allowed"] / "broken"
    shutil.copytree(adapters["a"], broken)
    cases = {
        "not json": "{not json",
        "a list": "[1, 2]",
        "rank zero": '{"peft_type": "LORA", "r": 0}',
        "rank text": '{"peft_type": "LORA", "r": "big"}',
        "other kind": '{"peft_type": "PREFIX_TUNING"}',
    }
    original = (adapters["a"] / "adapter_config.json").read_text()
    try:
        for label, text in cases.items():
            (broken / "adapter_config.json").write_text(text)
            r = load(server, "broken", broken)
            assert r.status_code == 400, (label, r.text)
            assert str(broken.resolve()) in r.json()["error"]["message"], label
        (broken / "adapter_config.json").write_text(original)
        (broken / "adapter_model.safetensors").write_bytes(b"truncated")
        r = load(server, "broken", broken)
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", r.text
        shutil.copy(adapters["qv"] / "adapter_model.safetensors", broken)  # fewer modules
        r = load(server, "broken", broken)
        assert r.status_code == 400 and "missing LoRA tensors" in r.text, r.text
        config = json.loads(original)
        for label, change in {"no such module": {"target_modules": ["nope_proj"]},
                              "rank of the file differs": {"r": 2}}.items():  # fmt: skip
            (broken / "adapter_config.json").write_text(json.dumps({**config, **change}))
            r = load(server, "broken", broken)
            assert r.status_code == 400 and str(broken.resolve()) in r.text, (label, r.text)
        assert load(server, "ok", adapters["a"]).status_code == 200  # a failed load leaves no mess
        (broken / "adapter_config.json").write_text(json.dumps({**config, "r": 2}))
        assert load(server, "ok", broken, inplace=True).status_code == 400  # reshaped, fails
        assert "ok" not in _cards(server) and "broken" not in _cards(server)
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError):
            generate(client, "ok")
        generate(client, "base")  # the server still serves
    finally:
        shutil.rmtree(broken)


def test_rl_rotation_reuses_unloaded_adapters(server, adapters, scorer, tiny_model_path):
    """An RL run loads a new name and unloads an old one every step: the new weights go into
    the PEFT modules the old name left (no new adapter injected), and each name serves its
    own weights, the base model none."""
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    rotation = [("v1", "a"), ("v2", "b"), ("v3", "a"), ("v4", "b"), ("v5", "qv"), ("v6", "a")]
    previous = None
    for name, which in rotation:
        assert load(server, name, adapters[which]).status_code == 200
        if previous is not None:
            assert unload(server, previous).status_code == 200
        assert_served_by(scorer, which, generate(client, name), others=[None])
        assert_served_by(scorer, None, generate(client, "base"))
        previous = name
    assert unload(server, previous).status_code == 200

    # in-process: the PEFT adapters made, not one per load
    from vfkit.serve.lora import LoraManager

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    lora = LoraManager(model, allowed_dirs=[adapters["allowed"]], max_lora_rank=8)
    previous = None
    for name, which in rotation[:4]:
        lora.apply_load(name, lora.check_load(name, str(adapters[which]), inplace=False))
        if previous is not None:
            lora.apply_unload(previous)
        previous = name
    assert len(lora.model.peft_config) == 2  # v1's and v2's, reused by v3 and v4
