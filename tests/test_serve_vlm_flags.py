"""The image flags (vLLM's names) on both backends: vLLM's command line and vf-serve's parser.

vLLM is not installed here: the vLLM backend is checked through the command line it builds, and
end to end with a stand-in script in vLLM's place that records its argv and runs vf-serve with
the image flags it was given (so `[inference] args` must mean the same to both servers).
"""

from __future__ import annotations

import json
import sys

import openai
import pytest
from PIL import Image

from vfkit.cli.serve import build_parser, config_from_args
from vfkit.serve.config import DEFAULT_IMAGES_PER_PROMPT
from vfkit.serve.launcher import start_server
from vfkit.serve.vllm import vllm_command
from vfkit.testing.tiny_vlm import make_tiny_vlm
from vfkit.train.placement import flag_args

IMAGE_ARGS = {"limit_mm_per_prompt": {"image": 2}, "allowed_local_media_path": "/data/imgs"}


def test_vllm_command_limits_images_for_an_image_model_unless_told():
    base = {"served_name": "m", "host": "127.0.0.1", "port": 8000}
    line = vllm_command("py", "/m", images=True, **base)
    at = line.index("--limit-mm-per-prompt")
    assert json.loads(line[at + 1]) == {"image": DEFAULT_IMAGES_PER_PROMPT}
    assert "--limit-mm-per-prompt" not in vllm_command("py", "/m", **base)  # a text model
    told = vllm_command("py", "/m", images=True, extra_args=flag_args(IMAGE_ARGS), **base)
    assert told.count("--limit-mm-per-prompt") == 1
    assert told[-4:] == [
        "--limit-mm-per-prompt", '{"image": 2}', "--allowed-local-media-path", "/data/imgs"
    ]  # fmt: skip


def test_vf_serve_reads_inference_args_image_flags_as_vllm_does():
    config = config_from_args(build_parser().parse_args(["/m", *flag_args(IMAGE_ARGS)]))
    assert config.limit_mm_per_prompt == {"image": 2} and config.max_images == 2
    assert config.allowed_local_media_path == "/data/imgs"
    legacy = config_from_args(build_parser().parse_args(["/m", "--limit-mm-per-prompt", "image=3"]))
    assert legacy.max_images == 3
    default = config_from_args(build_parser().parse_args(["/m"]))
    assert default.max_images == DEFAULT_IMAGES_PER_PROMPT
    assert default.allowed_local_media_path is None  # local files refused unless allowed


@pytest.mark.parametrize("bad", ["{image: 2}", "[1]", '{"image": -1}', '{"image": "two"}'])
def test_a_bad_limit_is_a_usage_error_naming_the_flag(bad, capsys):
    from vfkit.cli.serve import main

    with pytest.raises(SystemExit) as exit_:
        main(["/m", "--limit-mm-per-prompt", bad])
    assert exit_.value.code == 2
    assert "--limit-mm-per-prompt" in capsys.readouterr().err


STAND_IN = """\
#!{python}
# In vLLM's place: records how it was started, then runs vf-serve with the image flags given.
import argparse, json, sys
p = argparse.ArgumentParser()
for flag in ("-m", "--model", "--served-model-name", "--port", "--limit-mm-per-prompt",
             "--allowed-local-media-path"):
    p.add_argument(flag)
a, _ = p.parse_known_args()
json.dump(sys.argv[1:], open({record!r}, "w"))
from vfkit.cli.serve import main
sys.exit(main([a.model, "--served-model-name", a.served_model_name, "--port", a.port,
               "--threads", "1", "--dtype", "float32", "--device", "cpu",
               "--limit-mm-per-prompt", a.limit_mm_per_prompt,
               *(["--allowed-local-media-path", a.allowed_local_media_path]
                 if a.allowed_local_media_path else [])]))
"""


def test_vllm_backend_passes_image_flags_to_the_server(tmp_path):
    vlm = make_tiny_vlm(tmp_path / "vlm")
    media = tmp_path / "media"
    media.mkdir()
    Image.new("RGB", (32, 32), (200, 0, 0)).save(media / "red.png")
    record, fake = tmp_path / "argv.json", tmp_path / "python-with-vllm"
    fake.write_text(STAND_IN.format(python=sys.executable, record=str(record)))
    fake.chmod(0o755)
    args = flag_args({"allowed_local_media_path": str(media)})  # [inference] args
    with start_server(
        str(vlm), backend="vllm", executable=str(fake), extra_args=args,
        log_path=tmp_path / "server.log", health_timeout=120,
    ) as server:  # fmt: skip
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        part = {"type": "image_url", "image_url": {"url": f"file://{media / 'red.png'}"}}
        reply = client.chat.completions.create(
            model=str(vlm), messages=[{"role": "user", "content": [part]}], max_tokens=2,
            extra_body={"ignore_eos": True},  # random weights may sample EOS: not this test's point
        )
        assert reply.choices[0].finish_reason == "length"
        too_many = [{"role": "user", "content": [part] * (DEFAULT_IMAGES_PER_PROMPT + 1)}]
        with pytest.raises(openai.BadRequestError, match="limit-mm-per-prompt"):
            client.chat.completions.create(model=str(vlm), messages=too_many, max_tokens=2)
    argv = json.loads(record.read_text())
    limit = json.loads(argv[argv.index("--limit-mm-per-prompt") + 1])
    assert limit == {"image": DEFAULT_IMAGES_PER_PROMPT}  # the default the vLLM backend adds
    assert argv[argv.index("--allowed-local-media-path") + 1] == str(media)
