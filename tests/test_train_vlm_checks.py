"""Preflight for vision-language runs (run_checks, shared by vf-train and `vf-rl --dry-run`):
the processor is there, prompts fit max_prompt_len with their image tokens counted, LoRA
targets exist in the language model, and an image environment needs a VLM."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vfkit.errors import ConfigError
from vfkit.testing.tiny_vlm import IMAGE_TOKENS_PER_IMAGE
from vfkit.train.data import prompt_length
from vfkit.train.run_checks import Check, require_static_checks, static_checks
from vfkit.train.vision import load_processor


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def checks(model: Path, tmp: Path, *overrides: str) -> dict[str, Check]:
    import train_testing

    cfg = train_testing.tiny_config(model, tmp, "", 'env.id="train-image-colour"',
                                    "trainer.args.batch_size=8", *overrides)
    return {c.name: c for c in static_checks(cfg, server=False)[0]}


def failed(found: dict[str, Check]) -> list[Check]:
    return [c for c in found.values() if not c.ok]


def test_a_good_vlm_config_passes(vlm_path: Path, tmp_path: Path) -> None:
    found = checks(vlm_path, tmp_path)
    assert failed(found) == []
    assert "LlavaProcessor" in found["processor"].detail
    assert "language model (model.language_model)" in found["lora"].detail
    import train_image_colour

    text = prompt_length(load_processor(vlm_path), [{"role": "user", "content": "Colour?"}])
    want = text + IMAGE_TOKENS_PER_IMAGE  # the <image> placeholder expands to 16 tokens
    assert prompt_length(load_processor(vlm_path), train_image_colour.colour_prompt("red")) == want
    assert f"prompts {want}-{want} tokens with image tokens" in found["environment"].detail


def test_prompts_must_fit_max_prompt_len_with_their_image_tokens(
    vlm_path: Path, tmp_path: Path
) -> None:
    # the text alone (1 placeholder) is far shorter than 30 tokens; expanded, it is not
    (bad,) = failed(checks(vlm_path, tmp_path, "trainer.args.max_prompt_len=30"))
    assert bad.name == "environment"
    assert "trainer.args.max_prompt_len=30" in bad.detail and "with image tokens" in bad.detail


def test_a_vlm_folder_without_its_processor_is_named(vlm_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-processor"
    shutil.copytree(vlm_path, folder)
    (folder / "processor_config.json").unlink()
    found = checks(folder, tmp_path)
    assert not found["processor"].ok
    assert str(folder) in found["processor"].detail
    assert "processor.save_pretrained" in found["processor"].detail


def test_lora_targets_must_be_in_the_language_model(vlm_path: Path, tmp_path: Path) -> None:
    # fc1 is a layer of the CLIP vision tower only: frozen unless lora_train_vision
    (bad,) = failed(checks(vlm_path, tmp_path, 'trainer.args.lora_target_modules=["fc1"]'))
    assert bad.name == "lora" and "trainer.args.lora_target_modules" in bad.detail
    assert "lora_train_vision = true" in bad.detail and "q_proj" in bad.detail
    found = checks(vlm_path, tmp_path, 'trainer.args.lora_target_modules=["fc1"]',
                   "trainer.args.lora_train_vision=true")
    assert failed(found) == [] and "fc1" in found["lora"].detail
    (bad,) = failed(checks(vlm_path, tmp_path, 'trainer.args.lora_target_modules=["qq_proj"]'))
    assert "'qq_proj' is no module" in bad.detail


def test_an_image_environment_needs_a_vision_language_model(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    import train_testing

    cfg = train_testing.tiny_config(tiny_model_path, tmp_path, "", 'env.id="train-image-colour"',
                                    "trainer.args.batch_size=8")
    with pytest.raises(ConfigError, match="text-only model") as err:
        require_static_checks(cfg, server=False)
    assert "env.id = 'train-image-colour'" in str(err.value)


def test_a_vlm_under_transformers_4_is_refused_by_name_in_trainer_and_server(
    vlm_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    from vfkit.errors import VfkitError
    from vfkit.serve.model import load_served_model

    monkeypatch.setattr(transformers, "__version__", "4.57.6")  # what a 4.x install reports
    for load in (lambda: load_processor(vlm_path),
                 lambda: load_served_model(vlm_path, "float32", "cpu")):
        with pytest.raises(VfkitError, match=r"vision-language model.*4\.57\.6.*transformers>=5"):
            load()
    assert load_processor(tiny_model_path) is not None  # a text model loads on 4.57 as on 5


def test_local_file_images_are_read_from_the_servers_allowed_folder(
    vlm_path: Path, tmp_path: Path
) -> None:
    """Trainer and server read file:// images from the same allowed folder: the preflight and
    the dataset filter allowed none, so a run on local images could not start."""
    media = tmp_path / "media"
    media.mkdir()
    files = f'env.args={{files_dir = "{media}"}}'
    allowed = f'inference.args={{allowed_local_media_path = "{media}"}}'
    assert failed(checks(vlm_path, tmp_path, files, allowed)) == []
    (bad,) = failed(checks(vlm_path, tmp_path, files))
    assert "outside the allowed local media directories" in bad.detail
    import train_testing

    from vfkit.train.phases import load_data

    cfg = train_testing.tiny_config(vlm_path, tmp_path, "http://127.0.0.1:9/v1",
                                    'env.id="train-image-colour"', "trainer.args.batch_size=8",
                                    files, allowed)
    _, rows, _, _ = load_data(cfg, load_processor(vlm_path))
    assert len(rows) == 8  # measured with their images, none dropped
