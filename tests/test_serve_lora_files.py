"""Adapter folders a load must refuse: each is a 400 naming the problem, and afterwards the base
model answers exactly as before (an adapter file once overwrote the shared base weights)."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_serve_lora import make_adapter  # tests/ is on sys.path
from transformers import AutoConfig

from vfkit.serve.config import ServeConfig
from vfkit.serve.runner import BackgroundServer

PROMPT = {"model": "base", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0,
          "logprobs": 1}  # fmt: skip


def _variant(good, out, *, config=None, weights=None):
    """A copy of adapter folder `good` with its config and/or tensors changed."""
    shutil.copytree(good, out)
    if config is not None:
        (out / "adapter_config.json").write_text(json.dumps(config))
    if weights is not None:
        save_file(weights, str(out / "adapter_model.safetensors"))
    return out


@pytest.fixture(scope="module")
def folders(tiny_model_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    good = make_adapter(tiny_model_path, root / "good", seed=1)
    config = json.loads((good / "adapter_config.json").read_text())
    weights = load_file(str(good / "adapter_model.safetensors"))
    shape = (AutoConfig.from_pretrained(tiny_model_path).vocab_size,
             AutoConfig.from_pretrained(tiny_model_path).hidden_size)  # fmt: skip
    lm_head = {**weights, "base_model.model.lm_head.weight": torch.zeros(shape)}
    embed = {**weights, "base_model.model.model.embed_tokens.weight": torch.zeros(shape)}
    first = next(iter(weights))
    nan = {**weights, first: torch.full_like(weights[first], float("nan"))}
    return {
        "root": root,
        "good": good,
        "lm_head": _variant(good, root / "lm_head", weights=lm_head),
        "embed": _variant(good, root / "embed", weights=embed),
        "nan": _variant(good, root / "nan", weights=nan),
        "dora": _variant(good, root / "dora", config={**config, "use_dora": True}),
        "bias": _variant(good, root / "bias", config={**config, "bias": "all"}),
        # json.dumps writes NaN; adapter_config.json from a diverged run can hold it
        "alpha_nan": _variant(
            good, root / "alpha_nan", config={**config, "lora_alpha": float("nan")}
        ),
        # modules_to_save gets its own copy in PEFT: a full lm_head is allowed there
        "saved_head": _variant(
            good, root / "saved_head", config={**config, "modules_to_save": ["lm_head"]},
            weights={**weights, "base_model.model.lm_head.weight": torch.randn(shape)},
        ),
    }


@pytest.fixture(scope="module")
def server(tiny_model_path, folders):
    config = ServeConfig(
        str(tiny_model_path), served_model_name="base", dtype="float32", threads=1,
        allowed_adapter_dirs=(str(folders["root"]),),
    )  # fmt: skip
    with BackgroundServer(config) as srv:
        yield srv


def _load(server, name, path):
    body = {"lora_name": name, "lora_path": str(path)}
    return httpx.post(server.base_url + "/load_lora_adapter", json=body, timeout=60)


def _answer(server, model="base"):
    r = httpx.post(server.base_url + "/completions", json={**PROMPT, "model": model}, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


BAD = [
    ("lm_head", "lm_head.weight"),
    ("embed", "embed_tokens.weight"),
    ("nan", "NaN"),
    ("dora", "use_dora"),
    ("bias", "bias"),
    ("alpha_nan", "lora_alpha"),
]


@pytest.mark.parametrize(("which", "named"), BAD, ids=[w for w, _ in BAD])
def test_a_bad_adapter_is_refused_and_the_base_model_is_untouched(server, folders, which, named):
    before = _answer(server)
    r = _load(server, which, folders[which])
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert named in error["message"] and error["param"] == "lora_path", error
    assert _answer(server) == before
    names = [m["id"] for m in httpx.get(server.base_url + "/models").json()["data"]]
    assert which not in names


def test_modules_to_save_is_served_as_the_adapters_own_copy(server, folders):
    before = _answer(server)
    r = _load(server, "saved_head", folders["saved_head"])
    assert r.status_code == 200, r.text
    assert _answer(server, "saved_head") != before  # its random lm_head is used ...
    assert _answer(server) == before  # ... and the base model keeps its own


BAD_NAMES = [(" ", "blank"), ("a\nb", "newline"), ("x" * 300, "too-long")]


@pytest.mark.parametrize(("name", "_"), BAD_NAMES, ids=[i for _, i in BAD_NAMES])
def test_an_adapter_name_must_be_printable_and_short(server, folders, name, _):
    r = _load(server, name, folders["good"])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "lora_name"


def test_a_nul_in_the_path_is_a_400(server, folders):
    r = _load(server, "nul", str(folders["good"]) + "\x00")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "lora_path"


def test_concurrent_loads_of_one_name_succeed_once(server, folders):
    """Four loads of one new name at once: one "Success", three 400s (all four succeeded)."""

    async def four():
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"lora_name": "twice", "lora_path": str(folders["good"])}
            url = server.base_url + "/load_lora_adapter"
            return await asyncio.gather(*[client.post(url, json=body) for _ in range(4)])

    codes = sorted(r.status_code for r in asyncio.run(four()))
    assert codes == [200, 400, 400, 400], codes


def test_one_bad_value_is_found_and_huge_finite_weights_pass() -> None:
    """The fused norm flags a tensor; only an element-wise check convicts it (a norm of huge
    finite values overflows to inf too)."""
    from vfkit.serve.lora_files import first_non_finite

    good = {f"m{i}.lora_A.weight": torch.randn(16, 64) for i in range(5)}
    assert first_non_finite(good) is None
    for bad in (float("nan"), float("inf"), float("-inf")):
        weights = {k: t.clone() for k, t in good.items()}
        weights["m3.lora_A.weight"][7, 9] = bad
        assert first_non_finite(weights) == "m3.lora_A.weight"
    huge = {**good, "m1.lora_B.weight": torch.full((64, 16), 1e30)}  # norm: inf in fp32
    assert not torch.isfinite(torch.linalg.vector_norm(huge["m1.lora_B.weight"]))
    assert first_non_finite(huge) is None
    half = torch.randn(8, 8, dtype=torch.bfloat16)
    half[0, 0] = float("nan")
    assert first_non_finite({**good, "h.lora_B.weight": half, "ids": torch.arange(3)}) == (
        "h.lora_B.weight")
