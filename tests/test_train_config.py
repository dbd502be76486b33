"""Run-config parsing: typed tree, errors that name key + line + nearest key, overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vfkit.cli.train import main as vf_train
from vfkit.errors import ConfigError
from vfkit.train.config_loader import load_config, parse_config

ROOT = Path(__file__).resolve().parents[1]
BASE = 'model = "m"\n[env]\nid = "reverse-text"\n'


def run_configs() -> list[Path]:
    """Every shipped TOML that is a run config (has an [env] table)."""
    found = []
    for folder in ("configs", "examples", "environments"):
        for path in sorted((ROOT / folder).rglob("*.toml")):
            if path.name != "pyproject.toml" and "[env]" in path.read_text():
                found.append(path)
    return found


@pytest.mark.parametrize("path", run_configs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_run_config_parses(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.env.id and cfg.model


def test_exp_toml_is_shipped() -> None:
    assert ROOT / "configs" / "exp.toml" in run_configs()


def test_defaults() -> None:
    cfg = parse_config(BASE)
    assert cfg.args.loss_type == "grpo"  # async_level: the machine's (test below)
    assert cfg.run_name == "reverse-text--m"
    assert cfg.args.clip_high == cfg.args.epsilon  # epsilon_high defaults to epsilon


def test_async_level_default_is_what_the_machine_can_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for cores, level in (({0, 1}, 1), ({0}, 0)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: cores)
        assert parse_config(BASE).args.async_level == level
        text = BASE + "[trainer.args]\nasync_level = 2\n"
        assert parse_config(text).args.async_level == 2  # the config's value always wins
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert parse_config(BASE).args.async_level == 1  # one core, but the GPU does the work
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS, Windows: the core count instead
    for count, level in ((8, 1), (1, 0), (None, 0)):
        monkeypatch.setattr(os, "cpu_count", lambda count=count: count)
        assert parse_config(BASE).args.async_level == level


def test_unknown_key_names_line_and_nearest_key() -> None:
    text = BASE + "[trainer.args]\nbatch_size = 32\nlearning_rat = 1e-5\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, name="exp.toml")
    assert 'exp.toml:6: unknown key trainer.args.learning_rat — did you mean "learning_rate"?' in (
        str(err.value)
    )


def test_unknown_table_key_and_top_level() -> None:
    with pytest.raises(ConfigError, match=r'x.toml:5: unknown key inference.bas_url — did you mean '
                                          r'"base_url"'):
        parse_config(BASE + '[inference]\nbas_url = "http://x"\n', name="x.toml")
    with pytest.raises(ConfigError, match='unknown key modle — did you mean "model"'):
        parse_config('modle = "m"\n' + BASE)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('batch_size = "32"', "trainer.args.batch_size = '32': Input should be a valid integer"),
        ("bf16 = 1", "trainer.args.bf16 = 1: Input should be a valid boolean"),
        ("lora_target_modules = 5", "Input should be a valid list, or 'all-linear'"),
        ('loss_type = "ppo"', "Input should be 'grpo', 'dr_grpo', 'dapo' or 'cispo'"),
        ("temperature = 0", "Input should be greater than 0"),
        ("rollouts_per_example = 1", "rollouts_per_example = 1: Input should be greater than or"),
    ],
)
def test_wrong_types_and_ranges(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"c\.toml:5: ") as err:
        parse_config(BASE + f"[trainer.args]\n{line}\n", name="c.toml")
    assert message in str(err.value)


def test_missing_key_and_bad_toml() -> None:
    with pytest.raises(ConfigError, match=r"missing key env.id \(add it to \[env\]\)"):
        parse_config('model = "m"\n[env]\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_config("model = \n")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/exp.toml")


@pytest.mark.parametrize(
    ("args", "key", "message"),
    [
        (["batch_size=30"], "batch_size", "not a multiple of rollouts_per_example=8"),
        (["batch_size=16", "micro_batch_size=16", "rollouts_per_example=2"], "batch_size", None),
        (["batch_size=24", "micro_batch_size=16"], "batch_size", "micro_batch_size × world size"),
        (["lora_rank=128"], "lora_rank", "above the server's max_lora_rank=64"),
        (["use_lora=false"], "use_lora", "only LoRA training is supported"),
        (["max_prompt_len=1024"], "max_prompt_len", "leaves no room for a completion"),
        (["mask_ratio_low=9.0"], "mask_ratio_low", "must be below mask_ratio_high"),
    ],
)
def test_impossible_combinations(args: list[str], key: str, message: str | None) -> None:
    overrides = [f"trainer.args.{a}" for a in args]
    if message is None:
        parse_config(BASE, overrides=overrides)  # a valid combination
        return
    with pytest.raises(ConfigError, match=f"trainer.args.{key}: .*{message}"):
        parse_config(BASE, overrides=overrides)


def test_combination_errors_point_at_the_toml_line() -> None:
    text = BASE + "[trainer.args]\nrollouts_per_example = 8\nbatch_size = 20\n"
    with pytest.raises(ConfigError, match=r"^c.toml:6: trainer.args.batch_size: 20 is not"):
        parse_config(text, name="c.toml")


def test_world_size_counts_in_the_micro_batch_check(monkeypatch: pytest.MonkeyPatch) -> None:
    parse_config(BASE, overrides=["trainer.args.batch_size=16", "trainer.args.micro_batch_size=8"])
    with pytest.raises(ConfigError, match="8 × 4"):
        parse_config(BASE, overrides=["trainer.args.batch_size=16", "trainer.gpus=4"])
    monkeypatch.setenv("WORLD_SIZE", "4")  # under `accelerate launch`
    with pytest.raises(ConfigError, match="8 × 4"):
        parse_config(BASE, overrides=["trainer.args.batch_size=16"])


def test_server_max_lora_rank_from_inference_args() -> None:
    parse_config(BASE, overrides=["trainer.args.lora_rank=128", "inference.args.max_lora_rank=128"])
    with pytest.raises(ConfigError, match="max_lora_rank=8"):
        parse_config(BASE, overrides=["inference.args.max_lora_rank=8"])
    # an external server's limit is unknown unless given: no check
    parse_config(BASE, overrides=["trainer.args.lora_rank=128", "inference.base_url=http://x/v1"])


def test_missing_optional_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n in ("wandb", "vllm") else real(n, *a)
    )
    with pytest.raises(ConfigError, match='"wandb" is not installed: pip install wandb'):
        parse_config(BASE, overrides=['trainer.args.report_to=["jsonl", "wandb"]'])
    with pytest.raises(ConfigError, match=r'inference\.backend: "vllm" is not installed'):
        parse_config(BASE, overrides=['inference.backend="vllm"'])


def test_overrides_types_and_locations() -> None:
    cfg = parse_config(BASE, overrides=[
        "trainer.args.learning_rate=2e-5", "trainer.args.run_name=my-run", "env.args.max_words=3",
        'trainer.args.lora_target_modules=["q_proj", "v_proj"]',
        "trainer.args.report_to=tensorboard",
    ])
    assert cfg.args.learning_rate == 2e-5 and cfg.run_name == "my-run"
    assert cfg.env.args == {"max_words": 3}
    assert cfg.args.lora_target_modules == ["q_proj", "v_proj"]
    assert cfg.args.report_to == ["tensorboard"]
    with pytest.raises(ConfigError, match=r"override trainer\.args\.batch_sise: unknown"):
        parse_config(BASE, overrides=["trainer.args.batch_sise=8"])
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        parse_config(BASE, overrides=["trainer.args.batch_size"])
    with pytest.raises(ConfigError, match="model is a value, not a table"):
        parse_config(BASE, overrides=["model.x=1"])


def test_cli_reports_config_errors_before_loading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh interpreter: vf-train's config error comes before torch is even imported."""
    bad = tmp_path / "early.toml"
    bad.write_text('model = "no/such-model"\n[env]\nid = "nope"\n[trainer.args]\nbatchsize = 8\n')
    code = ("import sys; from vfkit.cli.train import main; rc = main([sys.argv[1]]); "
            "print('torch' in sys.modules, 'transformers' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout.split() == ["False", "False"], out.stderr
    path = tmp_path / "bad.toml"
    path.write_text('model = "no/such-model"\n[env]\nid = "nope"\n[trainer.args]\nbatchsize = 8\n')
    assert vf_train([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:5: unknown key trainer.args.batchsize" in err and "Traceback" not in err
