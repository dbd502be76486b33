"""Hostile and careless configs: every mistake is a named error (key, line, what to do), the same
in `vf-train` as in `vf-rl --dry-run`, and never a traceback or a run that "succeeds" at nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vfkit.cli.train import main as vf_train
from vfkit.errors import ConfigError
from vfkit.launch.main import main as vf_rl
from vfkit.train.config_loader import load_config, parse_config

BASE = 'model = "m"\n[env]\nid = "reverse-text"\n'

# (id, TOML appended to BASE, words the error must contain). Each line number is where the bad
# key sits in BASE + snippet.
STATIC_CASES = [
    ("lr-inf", "[trainer.args]\nlearning_rate = inf\n", ["x.toml:5", "learning_rate", "finite"]),
    ("lr-nan", "[trainer.args]\nlearning_rate = nan\n", ["x.toml:5", "learning_rate", "finite"]),
    ("lr-above-1", "[trainer.args]\nlearning_rate = 5.0\n", ["learning_rate", "less than"]),
    ("lr-negative", "[trainer.args]\nlearning_rate = -1e-4\n", ["learning_rate", "greater"]),
    ("lr-zero", "[trainer.args]\nlearning_rate = 0.0\n", ["learning_rate", "greater"]),
    ("temperature-inf", "[trainer.args]\ntemperature = inf\n", ["temperature", "finite"]),
    ("top-p-range", "[trainer.args]\ntop_p = 1.5\n", ["top_p", "less than"]),
    ("epsilon-nan", "[trainer.args]\nepsilon = nan\n", ["epsilon", "finite"]),
    ("grad-norm-inf", "[trainer.args]\nmax_grad_norm = inf\n", ["max_grad_norm", "finite"]),
    ("timeout-inf", "[trainer.args]\ngeneration_timeout = inf\n", ["generation_timeout"]),
    ("alpha-nan", "[trainer.args]\nlora_alpha = nan\n", ["lora_alpha", "finite"]),
    ("batch-zero", "[trainer.args]\nbatch_size = 0\n", ["batch_size", "greater"]),
    ("steps-negative", "[trainer.args]\nmax_steps = -3\n", ["max_steps", "greater"]),
    ("seed-negative", "[trainer.args]\nseed = -1\n", ["x.toml:5", "seed", "greater"]),
    ("concurrent-zero", "[trainer.args]\nmax_concurrent = 0\n", ["max_concurrent", "nothing"]),
    ("eval-n-zero", "[trainer.args]\neval_num_examples = 0\n", ["eval_num_examples"]),
    ("port-range", "[inference]\nport = 70000\n", ["x.toml:5", "inference.port"]),
    ("run-name-dotdot", '[trainer.args]\nrun_name = "../escape"\n', ["run_name", "one folder"]),
    ("run-name-slash", '[trainer.args]\nrun_name = "a/b"\n', ["run_name", "one folder"]),
    ("run-name-abs", '[trainer.args]\nrun_name = "/tmp/x"\n', ["run_name", "output_dir"]),
    ("run-name-dots", '[trainer.args]\nrun_name = ".."\n', ["run_name", "one folder"]),
    ("lora-targets-empty", "[trainer.args]\nlora_target_modules = []\n",
     ["lora_target_modules", "is empty"]),
    ("base-url-no-scheme", '[inference]\nbase_url = "localhost:8000"\n',
     ["x.toml:5", "inference.base_url", "http"]),
    ("base-url-ftp", '[inference]\nbase_url = "ftp://host/v1"\n', ["inference.base_url"]),
    ("base-url-port", '[inference]\nbase_url = "http://h:99999/v1"\n', ["base_url", "port"]),
    ("dtype-unknown", '[inference.args]\ndtype = "fp17"\n', ["inference.args", "fp17", "bfloat16"]),
    ("server-rank-zero", "[inference.args]\nmax-lora-rank = 0\n", ["max_lora_rank", ">= 1"]),
    ("server-seqs-zero", "[inference.args]\nmax_num_seqs = 0\n", ["max_num_seqs", ">= 1"]),
    ("output-dir-blank", '[trainer.args]\noutput_dir = " "\n', ["output_dir", "is empty"]),
]


@pytest.mark.parametrize(("snippet", "words"), [c[1:] for c in STATIC_CASES],
                         ids=[c[0] for c in STATIC_CASES])
def test_bad_value_is_named_with_its_line(snippet: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE + snippet, name="x.toml")
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('model = ""\n[env]\nid = "reverse-text"\n', ["x.toml:1", "model", "is empty"]),
        ('model = "m"\n[env]\nid = " "\n', ["x.toml:3", "env.id", "is empty"]),
        ('model = "m"\n[env]\nid = "../../etc"\n', ["env.id", "run_name"]),
    ],
    ids=["empty-model", "blank-env-id", "env-id-escapes-output-dir"],
)
def test_bad_names(text: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, name="x.toml")
    for word in words:
        assert word in str(err.value), str(err.value)


@pytest.mark.parametrize("name", ["exp.v2", "Qwen2.5-0.5B", "run_1.0"])
def test_dotted_run_names_pass(name: str) -> None:
    cfg = parse_config(BASE + f'[trainer.args]\nrun_name = "{name}"\n')
    assert cfg.run_name == name
    assert parse_config(BASE.replace('"m"', '"Qwen/Qwen2.5-0.5B"')).run_name.endswith("0.5B")


def test_probe_tolerance_inf_still_means_off() -> None:
    cfg = parse_config(BASE + "[trainer.args]\nadapter_probe_tolerance = inf\n")
    assert not cfg.args.probe_enabled


def test_non_utf8_toml_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes((BASE + '[trainer.args]\nrun_name = "caf\xe9"\n').encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml:5: not UTF-8"):
        load_config(path)


@pytest.mark.parametrize("cli", ["vf-train", "vf-rl"])
def test_clis_print_config_errors_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(BASE.encode() + b"[trainer.args]\nlearning_rate = inf\n\xff\n")
    argv = [str(path)] if cli == "vf-train" else ["--dry-run", str(path)]
    code = (vf_train if cli == "vf-train" else vf_rl)(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert "not UTF-8" in err and "Traceback" not in err
    path.write_text(BASE + "[trainer.args]\nlearning_rate = inf\n")
    code = (vf_train if cli == "vf-train" else vf_rl)(argv)
    err = capsys.readouterr().err
    assert code == 2 and "bad.toml:5" in err and "learning_rate" in err


def test_api_key_is_redacted_in_dumps_and_errors() -> None:
    cfg = parse_config(BASE + '[inference]\napi_key = "sk-secret-1"\n')
    assert cfg.inference.api_key == "sk-secret-1"  # the client still gets it
    assert "sk-secret-1" not in str(cfg.model_dump(mode="json"))  # what wandb/tensorboard get
    assert "sk-secret-1" not in cfg.model_dump_json()
    with pytest.raises(ConfigError) as err:
        parse_config(BASE + "[inference]\napi_key = 12345678\n")
    assert "12345678" not in str(err.value) and "inference.api_key" in str(err.value)
