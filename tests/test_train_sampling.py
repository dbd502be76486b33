"""Sampling-arg precedence in training: built-in defaults < env's own < config keys set."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfkit.client.sampling import merge_sampling_args
from vfkit.testing.scripted_server import TestServer
from vfkit.train.phases import load_envs, train, with_rollout_sampling

ENV_SAMPLING = 'env.args.sampling_args={max_tokens = 5, temperature = 0.5, top_k = 3}'


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def test_merge_order_and_extra_body() -> None:
    merged = merge_sampling_args(
        {"max_tokens": 128, "temperature": 1.0},          # built-in defaults
        {"max_tokens": 48, "top_k": 5},                    # the environment's own
        {"temperature": 0.7, "extra_body": {"top_k": 7}},  # keys the config sets
    )
    assert merged == {"max_tokens": 48, "temperature": 0.7, "extra_body": {"top_k": 7}}


def test_env_sampling_args_reach_the_server_unless_the_config_sets_them(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    import train_testing

    with TestServer(train_testing.GroupResponder()) as srv:
        # tiny_config writes max_tokens = 8 in [trainer.args]; it says nothing of temperature
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url, ENV_SAMPLING,
                                        "trainer.args.max_steps=1")
        train(cfg)
        bodies = list(srv.requests)
    assert bodies and all(b["max_tokens"] == 8 for b in bodies)  # the config wins
    assert all(b["temperature"] == 0.5 for b in bodies)  # the env's own, config silent
    assert all(b["top_k"] == 3 for b in bodies)  # vLLM-only knob, sent in the body


def test_the_loss_uses_the_temperature_rollouts_were_sampled_with(tiny_model_path: Path) -> None:
    import train_testing

    cfg = train_testing.tiny_config(tiny_model_path, Path("/tmp"), "http://x/v1", ENV_SAMPLING)
    env, _ = load_envs(cfg)
    resolved, sampling = with_rollout_sampling(cfg, env)
    assert sampling["temperature"] == resolved.trainer.args.temperature == 0.5
    assert resolved.trainer.args.max_tokens == 8
    set_by_config = train_testing.tiny_config(tiny_model_path, Path("/tmp"), "http://x/v1",
                                              ENV_SAMPLING, "trainer.args.temperature=0.9")
    assert with_rollout_sampling(set_by_config, env)[0].trainer.args.temperature == 0.9


def test_an_orchestrator_given_no_sampling_args_layers_them_as_training_does(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """The Orchestrator's own default (its docstring's usage) must not put the built-in
    defaults over the environment's sampling_args: it once sent temperature 1.0 here."""
    import train_testing
    from transformers import AutoTokenizer

    from vfkit.train.orchestrator import Orchestrator
    from vfkit.train.phases import load_data
    from vfkit.train.rundir import RunDir

    with TestServer(train_testing.GroupResponder()) as srv:
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url, ENV_SAMPLING)
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
        env, rows, _, _ = load_data(cfg, tokenizer)
        with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.trainer.args,
                          run=RunDir(tmp_path / cfg.run_name)) as orch:
            assert orch.eval_sampling_args == orch.sampling_args
            orch.submit(1)
            orch.get(1)
        bodies = list(srv.requests)
    assert bodies and all(b["temperature"] == 0.5 for b in bodies)  # the env's own
    assert all(b["max_tokens"] == 8 and b["top_k"] == 3 for b in bodies)  # config, env


def test_an_env_limit_spelled_max_completion_tokens_is_the_one_the_loss_uses(
    tiny_model_path: Path,
) -> None:
    import train_testing

    spelled = 'env.args.sampling_args={max_completion_tokens = 6}'
    cfg = train_testing.tiny_config(tiny_model_path, Path("/tmp"), "http://x/v1", spelled,
                                    "trainer.args.max_tokens=8")
    env, _ = load_envs(cfg)
    resolved, sampling = with_rollout_sampling(cfg, env)  # the config's 8 wins: one limit sent
    assert sampling.get("max_tokens") == 8 and "max_completion_tokens" not in sampling
    from vfkit.train.config_loader import parse_config

    silent = parse_config(f'model = "{tiny_model_path}"\n[env]\nid = "train-letter-a"\n',
                          overrides=[spelled])  # no max_tokens in the config
    resolved, sampling = with_rollout_sampling(silent, env)
    assert sampling["max_completion_tokens"] == 6 and "max_tokens" not in sampling
    assert resolved.trainer.args.max_tokens == 6  # what the loss normalises by
