"""Training a vision-language policy, piece by piece, on a tiny random LLaVA: LoRA on the
language model only, samples that carry their images, vision inputs in the micro-batches and
the forward, image tokens never in the loss, corrupt rollouts dropped and counted, and
rollout records that keep their images for `--phase update`."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from PIL import Image
from transformers import AutoModelForImageTextToText

from vfkit.images import image_part
from vfkit.testing.tiny_vlm import IMAGE_TOKENS_PER_IMAGE
from vfkit.train.batching import micro_batches
from vfkit.train.data import prompt_length, read_rollouts, write_rollouts
from vfkit.train.learner import Learner
from vfkit.train.policy import token_logprobs
from vfkit.train.rundir import RunDir
from vfkit.train.samples import build_samples, rollout_samples

torch.set_num_threads(1)
LANGUAGE = "model.language_model."


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def learner(model: Path, tmp: Path, *overrides: str) -> Learner:
    import train_testing

    cfg = train_testing.tiny_config(model, tmp, "", *overrides)
    run = RunDir(tmp / cfg.run_name)
    run.root.mkdir(parents=True, exist_ok=True)
    return Learner(cfg, run)


def lora_modules(lrn: Learner) -> set[str]:
    return {n.removeprefix("base_model.model.").split(".lora_A")[0]
            for n in lrn.lora_weights() if ".lora_A." in n}


def square(rgb: tuple[int, int, int]) -> str:
    return image_part(Image.new("RGB", (32, 32), rgb))["image_url"]["url"]


RED, BLUE = square((220, 20, 20)), square((20, 20, 220))


def user(*urls: str, text: str = "Colour?") -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def turn(processor, messages: list[dict], completion: str, prompt_ids=None) -> dict:
    """One trajectory step as the server returns it: image placeholders already expanded.

    The server renders its own copy of the messages (transformers 5.17's processor template
    rewrites image_url parts in the messages it is given)."""
    if prompt_ids is None:
        prompt_ids = processor.apply_chat_template(
            copy.deepcopy(messages), tokenize=True, add_generation_prompt=True, return_dict=True
        )["input_ids"]
        prompt_ids = prompt_ids[0] if isinstance(prompt_ids[0], list) else prompt_ids
    ids = processor.tokenizer.encode(completion, add_special_tokens=False)
    return {"prompt": messages, "tokens": {
        "prompt_ids": list(prompt_ids), "prompt_mask": [0] * len(prompt_ids),
        "completion_ids": ids, "completion_mask": [1] * len(ids),
        "completion_logprobs": [-5.0] * len(ids), "overlong_prompt": False,
        "is_truncated": False}}


def state(*steps: dict, advantage: float = 1.0) -> dict:
    return {"advantage": advantage, "reward": advantage, "trajectory": list(steps)}


# ----------------------------------------------------------------------------- policy
def test_lora_adapts_the_language_model_only(vlm_path: Path, tmp_path: Path) -> None:
    lrn = learner(vlm_path, tmp_path)  # lora_target_modules = "all-linear" (the default)
    modules = lora_modules(lrn)
    assert len(modules) == 14  # 2 layers x (q k v o gate up down)
    assert all(m.startswith(LANGUAGE) for m in modules)  # no vision tower, projector, lm_head
    frozen = [n for n, p in lrn.peft_model.named_parameters()
              if ("vision_tower" in n or "multi_modal_projector" in n) and p.requires_grad]
    assert frozen == []
    # q_proj exists in the CLIP tower too: a module name still means the language model's
    named = lora_modules(learner(vlm_path, tmp_path, 'trainer.args.lora_target_modules=["q_proj"]'))
    assert named == {f"{LANGUAGE}layers.{i}.self_attn.q_proj" for i in (0, 1)}
    head = lora_modules(learner(vlm_path, tmp_path,
                                'trainer.args.lora_target_modules=["q_proj", "lm_head"]'))
    assert "lm_head" in head and len(head) == 3  # an output layer named explicitly is adapted


def test_lora_train_vision_adds_the_vision_tower(vlm_path: Path, tmp_path: Path) -> None:
    modules = lora_modules(learner(vlm_path, tmp_path, "trainer.args.lora_train_vision=true"))
    assert "model.vision_tower.encoder.layers.0.self_attn.q_proj" in modules
    assert "model.multi_modal_projector.linear_1" in modules
    assert "lm_head" not in modules and len(modules) == 22  # 14 language + 6 tower + 2 proj


def test_saved_adapter_loads_on_the_base_model(vlm_path: Path, tmp_path: Path) -> None:
    lrn = learner(vlm_path, tmp_path)
    with torch.no_grad():  # a non-zero B so that the adapter changes the output
        for name, p in lrn.peft_model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.5)
    adapter = lrn.save_adapter(1)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert "language_model" in config["target_modules"]
    device = lrn.peft_model.device  # the learner's accelerator (a GPU where there is one)
    base = AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32)
    served = PeftModel.from_pretrained(base, adapter).to(device).eval()
    lrn.peft_model.eval()
    proc = lrn.processor
    inputs = proc.apply_chat_template([user(RED)], tokenize=True, add_generation_prompt=True,
                                      return_dict=True, return_tensors="pt").to(device)
    with torch.no_grad():
        want = lrn.peft_model(**inputs).logits
        got = served(**inputs).logits
    assert torch.allclose(want, got, atol=1e-5)


# ----------------------------------------------------------------------------- samples
def test_a_sample_carries_its_images_and_their_vision_inputs(
    vlm_path: Path, tmp_path: Path
) -> None:
    lrn = learner(vlm_path, tmp_path)
    proc = lrn.processor
    first = [user(RED)]
    step1 = turn(proc, first, "red")
    second = [*first, {"role": "assistant", "content": "red"}, user(BLUE, text="And now?")]
    step2 = turn(proc, second, "blue")
    assert step2["tokens"]["prompt_ids"][:len(step1["tokens"]["prompt_ids"])] == (
        step1["tokens"]["prompt_ids"])
    (sample,) = rollout_samples(state(step1, step2))
    assert sample.images == [RED, BLUE]  # the last turn's prompt images, in prompt order
    (sample,), counts = build_samples([[state(step1, step2)]], max_seq_len=400,
                                      mask_truncated=False, images=lrn.images)
    assert counts.bad_images == 0
    assert tuple(sample.vision["pixel_values"].shape) == (2, 3, 32, 32)
    assert sample.input_ids.count(lrn.images.image_token_id) == 2 * IMAGE_TOKENS_PER_IMAGE


def test_image_tokens_never_get_loss(vlm_path: Path, tmp_path: Path) -> None:
    lrn = learner(vlm_path, tmp_path)
    image_id = lrn.images.image_token_id
    # a (broken) server that marked an image token as sampled: the guard still masks it
    step = turn(lrn.processor, [user(RED)], "red")
    step["tokens"]["completion_ids"].insert(1, image_id)
    step["tokens"]["prompt_ids"].remove(image_id)  # still 16 placeholders in the sequence
    for key, value in (("completion_mask", 1), ("completion_logprobs", -5.0)):
        step["tokens"][key].append(value)
    samples, counts = build_samples([[state(step)]], max_seq_len=400, mask_truncated=False,
                                    images=lrn.images)
    (sample,) = samples
    assert counts.bad_images == 0
    at_images = [m for t, m in zip(sample.input_ids, sample.loss_mask, strict=True)
                 if t == image_id]
    assert len(at_images) == IMAGE_TOKENS_PER_IMAGE and set(at_images) == {0}
    assert sample.num_loss_tokens == 3  # "red" only


def test_corrupt_image_rollouts_are_dropped_and_counted(vlm_path: Path, tmp_path: Path) -> None:
    lrn = learner(vlm_path, tmp_path)
    proc = lrn.processor
    good = turn(proc, [user(RED)], "red")
    ids = good["tokens"]["prompt_ids"]
    missing = turn(proc, [user(RED)], "red", [t for t in ids if t != lrn.images.image_token_id])
    extra_image = turn(proc, [user(RED, BLUE)], "red", ids)  # 2 images, 16 placeholders
    unreadable = turn(proc, [user("data:image/png;base64,AAAA")], "red", ids)
    samples, counts = build_samples(
        [[state(good), state(missing), state(extra_image), state(unreadable)]],
        max_seq_len=400, mask_truncated=False, images=lrn.images)
    assert len(samples) == 1 and samples[0].images == [RED]
    assert counts.bad_images == 3


# ----------------------------------------------------------------------------- batches, loss
def one_two_and_no_images(lrn: Learner) -> list:
    """Three samples: one image, two images, none (all kept: placeholders match)."""
    proc = lrn.processor
    one = state(turn(proc, [user(RED)], "red"))
    two = state(turn(proc, [user(BLUE, RED)], "blue"), advantage=-1.0)
    text = state(turn(proc, [{"role": "user", "content": "Colour?"}], "no"))
    samples, counts = build_samples([[one, two, text]], max_seq_len=400, mask_truncated=False,
                                    images=lrn.images)
    assert len(samples) == 3 and counts.bad_images == 0
    return samples


def test_micro_batches_carry_vision_inputs_to_the_forward(vlm_path: Path, tmp_path: Path) -> None:
    lrn = learner(vlm_path, tmp_path, "trainer.args.micro_batch_size=4")
    samples = one_two_and_no_images(lrn)
    (mb,) = micro_batches(samples, 4, lrn.pad_id, images=lrn.images,
                          device=lrn.peft_model.device)
    assert tuple(mb.vision["pixel_values"].shape) == (3, 3, 32, 32)  # 2 + 1 + 0 images
    # the images reach the forward: the same ids with other pixels give other logprobs
    model = lrn.peft_model
    with torch.no_grad():
        seen, _ = token_logprobs(model, mb.input_ids_BT, mb.attention_mask_BT, 1.0,
                                 vision=mb.vision)
        flipped = {"pixel_values": mb.vision["pixel_values"].flip(0)}
        other, _ = token_logprobs(model, mb.input_ids_BT, mb.attention_mask_BT, 1.0,
                                  vision=flipped)
    assert not torch.allclose(seen, other)
    before = lrn.lora_weights()
    metrics = lrn.update(samples)
    assert metrics["grad_norm"] > 0
    after = lrn.lora_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_kl_to_base_runs_with_images(vlm_path: Path, tmp_path: Path) -> None:
    lrn = learner(vlm_path, tmp_path, "trainer.args.beta=0.1")
    samples, _ = build_samples([[state(turn(lrn.processor, [user(RED)], "red"))]],
                               max_seq_len=400, mask_truncated=False, images=lrn.images)
    assert lrn.update(samples)["kl/base"] == pytest.approx(0.0, abs=1e-6)  # adapter B = 0


# ----------------------------------------------------------------------------- records, lengths
def test_rollout_records_keep_each_turns_images(vlm_path: Path, tmp_path: Path) -> None:
    lrn = learner(vlm_path, tmp_path)
    proc = lrn.processor
    first = [user(RED)]
    second = [*first, {"role": "assistant", "content": "red"}, user(BLUE, text="And now?")]
    live = state(turn(proc, first, "red"), turn(proc, second, "blue"))
    live["prompt"], live["completion"] = first, [*second[1:], {"role": "assistant",
                                                               "content": "blue"}]
    path = tmp_path / "rollouts" / "step_1.jsonl"
    write_rollouts(path, [[live]], policy_version=0)
    text = path.read_text()
    record = json.loads(text)
    assert record["images"] == [RED, BLUE]  # each image once per rollout
    assert text.count(RED) == 1 and text.count(BLUE) == 1  # not again in prompt or completion
    assert [s["image_refs"] for s in record["trajectory"]] == [[0], [0, 1]]
    (saved,), _ = read_rollouts(path)
    assert saved[0]["prompt"] == live["prompt"]  # read back as sampled
    assert saved[0]["completion"] == live["completion"]
    (from_live,) = rollout_samples(live)
    (from_file,) = rollout_samples(saved[0])
    assert (from_file.images, from_file.input_ids) == (from_live.images, from_live.input_ids)


def test_prompt_length_counts_expanded_image_tokens(vlm_path: Path, tmp_path: Path) -> None:
    proc = learner(vlm_path, tmp_path).processor
    text_only = prompt_length(proc, [{"role": "user", "content": "Colour?"}])
    # <image> placeholder -> 16 image tokens each
    assert prompt_length(proc, [user(RED)]) == text_only + IMAGE_TOKENS_PER_IMAGE
    assert prompt_length(proc, [user(RED, BLUE)]) == text_only + 2 * IMAGE_TOKENS_PER_IMAGE
    prompt = [user(RED)]  # counted, not changed: these very prompts go to the server
    prompt_length(proc, prompt)
    assert prompt == [user(RED)]


def test_saved_adapters_hold_lora_tensors_only(vlm_path: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    # PEFT copies a targeted lm_head's full base weight into the adapter unless told not to;
    # servers refuse that tensor (vf-serve: "targets module(s) this model does not have")
    lrn = learner(vlm_path, tmp_path, 'trainer.args.lora_target_modules=["q_proj", "lm_head"]')
    names = list(load_file(lrn.save_adapter(1) / "adapter_model.safetensors"))
    assert any("lm_head.lora_A" in n for n in names)
    assert [n for n in names if ".lora_" not in n] == []


def test_idefics3_image_stacks_of_different_sizes_share_a_micro_batch(tmp_path: Path) -> None:
    """SmolVLM's layout: one image stack per prompt, padded to the longest; each sample's
    logprobs in the shared micro-batch equal those it gets alone (padding images drop out)."""
    from vfkit.testing.tiny_vlm import make_tiny_idefics3

    lrn = learner(make_tiny_idefics3(tmp_path / "idefics3"), tmp_path)
    samples = one_two_and_no_images(lrn)
    (mb,) = micro_batches(samples, 3, lrn.pad_id, images=lrn.images,
                          device=lrn.peft_model.device)
    assert tuple(mb.vision["pixel_values"].shape)[:2] == (2, 2)  # 2 prompts, padded to 2 images
    model = lrn.peft_model
    with torch.no_grad():
        together, _ = token_logprobs(model, mb.input_ids_BT, mb.attention_mask_BT, 1.0,
                                     vision=mb.vision)
        order = sorted(range(3), key=lambda i: (-len(samples[i]), i))  # the batcher's row order
        for row, sample in enumerate(samples[i] for i in order):
            (alone_mb,) = micro_batches([sample], 1, lrn.pad_id, images=lrn.images,
                                        device=model.device)
            alone, _ = token_logprobs(model, alone_mb.input_ids_BT, alone_mb.attention_mask_BT,
                                      1.0, vision=alone_mb.vision)
            n = alone.shape[1]
            torch.testing.assert_close(together[row, :n], alone[0], atol=1e-4, rtol=0)
    assert lrn.update(samples)["grad_norm"] > 0
