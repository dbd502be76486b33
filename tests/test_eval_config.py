"""vf-eval settings: flag parsing, the endpoint registry, pyproject defaults, resume checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vfkit.cli.eval import build_parser, config_from_args
from vfkit.errors import ConfigError
from vfkit.evaluation.config import EvalConfig, build_sampling_args, parse_headers
from vfkit.evaluation.defaults import eval_defaults, find_env_pyproject, read_eval_defaults
from vfkit.evaluation.endpoints import find_endpoint, load_endpoints
from vfkit.evaluation.resume import apply_resumed_settings

REPO = Path(__file__).resolve().parents[1]


def _cfg(*argv: str) -> EvalConfig:
    return config_from_args(build_parser().parse_args(list(argv)))


def test_all_flags_reach_the_config():
    cfg = _cfg(
        "my-env", "-a", '{"x": 1}', "-m", "m", "-b", "http://h/v1", "-k", "KEYVAR",
        "--header", "X-A: 1", "--header", "X-B: two: parts", "-e", "reg.toml", "-n", "7",
        "-r", "2", "-c", "4", "-t", "16", "-T", "0.5", "-S", '{"temperature": 0.9, "top_p": 0.8}',
        "-C", "turn,responses", "-C", "turn", "-f", "3", "-o", "out", "--timeout", "9",
        "--max-retries", "0", "-v",
    )  # fmt: skip
    assert cfg.env_id == "my-env" and cfg.env_args == {"x": 1} and cfg.model == "m"
    assert cfg.api_base_url == "http://h/v1" and cfg.api_key_var == "KEYVAR"
    assert cfg.headers == {"X-A": "1", "X-B": "two: parts"}
    assert cfg.endpoints_path == Path("reg.toml")
    assert (cfg.num_examples, cfg.rollouts_per_example, cfg.max_concurrent) == (7, 2, 4)
    # -S wins over -T for temperature; -t survives
    assert cfg.sampling_args == {"max_tokens": 16, "temperature": 0.9, "top_p": 0.8}
    assert cfg.state_columns == ["turn", "responses"]
    assert cfg.save_every == 3 and cfg.output_dir == Path("out") and cfg.save_results  # -o => -s
    assert cfg.timeout == 9 and cfg.max_retries == 0 and cfg.verbose


def test_unset_flags_stay_unset():
    cfg = _cfg("my-env")
    assert cfg.model is None and cfg.num_examples is None and cfg.rollouts_per_example is None
    assert cfg.sampling_args == {} and not cfg.save_results


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["-S", "{temperature: 1}"], "-S/--sampling-args"),
        (["-S", "[1, 2]"], "-S/--sampling-args"),
        (["-a", "{'x': 1}"], "-a/--env-args"),
        (["--header", "no-colon"], "--header"),
        (["-r", "0"], "-r/--rollouts-per-example"),
        (["-n", "0"], "-n/--num-examples"),
        (["-f", "0"], "-f/--save-every"),
        (["-t", "0"], "-t/--max-tokens"),
    ],
)
def test_bad_flag_values_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as info:
        _cfg("my-env", *argv)
    assert str(info.value).startswith(flag)


def test_sampling_args_and_headers_helpers():
    assert build_sampling_args(None, None, None) == {}
    assert build_sampling_args(5, 0.0, '{"extra_body": {"top_k": 3}}') == {
        "max_tokens": 5,
        "temperature": 0.0,
        "extra_body": {"top_k": 3},
    }
    assert parse_headers(None) == {}


def test_registry_loads_and_rejects_bad_entries(tmp_path):
    path = tmp_path / "endpoints.toml"
    path.write_text('[[endpoint]]\nid = "a"\nmodel = "org/a"\nurl = "http://x/v1"\nkey = "K"\n')
    assert load_endpoints(path)["a"].model == "org/a"
    assert find_endpoint("a", path, default_path=tmp_path / "none").url == "http://x/v1"
    assert find_endpoint("zzz", path, default_path=tmp_path / "none") is None
    assert find_endpoint("a", None, default_path=tmp_path / "none") is None
    path.write_text('[[endpoint]]\nid = "a"\nmodel = "m"\nurl = "u"\napi_key = "K"\n')
    with pytest.raises(ConfigError, match=r"unknown key.*api_key"):
        load_endpoints(path)
    path.write_text('[[endpoint]]\nid = "a"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match="url"):
        load_endpoints(path)
    with pytest.raises(ConfigError, match="no such file"):
        load_endpoints(tmp_path / "missing.toml")


def test_shipped_registry_parses():
    registry = load_endpoints(REPO / "configs" / "endpoints.toml")
    assert registry and all(e.url.startswith("http") for e in registry.values())


def test_pyproject_defaults_vfkit_table_wins_over_verifiers(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.vfkit.eval]\nnum_examples = 4\n"
        "[tool.verifiers.eval]\nnum_examples = 9\nrollouts_per_example = 2\n"
    )
    assert read_eval_defaults(pyproject) == {"num_examples": 4, "rollouts_per_example": 2}
    pyproject.write_text("[tool.vfkit.eval]\nrollouts_per_example = 0\n")
    with pytest.raises(ConfigError, match="rollouts_per_example"):
        read_eval_defaults(pyproject)


def test_env_pyproject_found_next_to_the_module(tmp_path, monkeypatch):
    pkg = tmp_path / "environments" / "my-env"
    pkg.mkdir(parents=True)
    (pkg / "my_env_for_defaults.py").write_text("def load_environment():\n    pass\n")
    (pkg / "pyproject.toml").write_text("[tool.verifiers.eval]\nnum_examples = 11\n")
    monkeypatch.syspath_prepend(str(pkg))
    assert find_env_pyproject("my-env-for-defaults") == pkg / "pyproject.toml"
    assert eval_defaults("my-env-for-defaults") == {"num_examples": 11}
    # not importable: environments/<id>/pyproject.toml under the working folder
    assert find_env_pyproject("my-env", search_root=tmp_path) == pkg / "pyproject.toml"
    assert eval_defaults("no-such-env-xyz", search_root=tmp_path) == {}
    sys.modules.pop("my_env_for_defaults", None)


def test_resume_fills_unset_flags_and_rejects_conflicts(tmp_path):
    meta = {"env_id": "e", "env_args": {"a": 1}, "model": "m", "num_examples": 3,
            "rollouts_per_example": 2, "sampling_args": {"max_tokens": 8},
            "state_columns": ["turn"], "endpoint_source": "flag",
            "base_url": "http://h/v1"}  # fmt: skip
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    cfg = EvalConfig(resume=tmp_path / "results.jsonl")
    assert apply_resumed_settings(cfg) == tmp_path
    assert (cfg.env_id, cfg.env_args, cfg.model) == ("e", {"a": 1}, "m")
    assert (cfg.num_examples, cfg.rollouts_per_example) == (3, 2)
    assert cfg.sampling_args == {"max_tokens": 8} and cfg.state_columns == ["turn"]
    assert cfg.api_base_url == "http://h/v1" and cfg.save_results
    with pytest.raises(ConfigError, match="-r/--rollouts-per-example"):
        apply_resumed_settings(EvalConfig(resume=tmp_path, rollouts_per_example=5))
    with pytest.raises(ConfigError, match="no run folder"):
        apply_resumed_settings(EvalConfig(resume=tmp_path / "nope"))


def test_env_pyproject_is_the_loaded_modules_whatever_the_working_folder(tmp_path, monkeypatch):
    """vfkit's own packages are modules `vfkit_<id>`: the defaults of reverse-text were read
    only when the working folder held environments/reverse-text (the repo root)."""
    pkg = tmp_path / "site" / "my-env-prefixed"
    pkg.mkdir(parents=True)
    (pkg / "vfkit_my_env_prefixed.py").write_text("def load_environment():\n    pass\n")
    (pkg / "pyproject.toml").write_text("[tool.vfkit.eval]\nnum_examples = 7\n")
    # a decoy: a plain `my_env_prefixed` module elsewhere, which the registry would not load
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "my_env_prefixed.py").write_text("def load_environment():\n    pass\n")
    (decoy / "pyproject.toml").write_text("[tool.vfkit.eval]\nnum_examples = 99\n")
    monkeypatch.syspath_prepend(str(decoy))
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.chdir(tmp_path)  # no environments/ here
    assert find_env_pyproject("my-env-prefixed") == pkg / "pyproject.toml"
    assert eval_defaults("my-env-prefixed") == {"num_examples": 7}


def test_registry_entries_that_are_not_tables_are_named_with_their_line(tmp_path):
    path = tmp_path / "endpoints.toml"
    path.write_text("# my endpoints\n\nendpoint = [1, 2]\n")  # a raw TypeError before
    with pytest.raises(ConfigError) as info:
        load_endpoints(path)
    assert str(info.value).startswith(f"{path} line 3: endpoint #1 must be a table, got 1")
    assert "[[endpoint]]" in str(info.value)
