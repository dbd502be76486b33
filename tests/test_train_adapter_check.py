"""Hot-load verification: exact by fingerprint, robust by probe, never a false alarm.

The default run once died at step 40 on "logprobs differ by 0.24 over 4 probe tokens" while the
bf16 server and fp32 trainer differed by 0.015-0.09 on the 39 steps before: precision noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from vfkit.errors import AdapterSyncError
from vfkit.lora_fingerprint import fingerprint_dir
from vfkit.serve.launcher import start_server
from vfkit.testing.scripted_server import TestServer
from vfkit.train.adapter_sync import Probe, check_probe, probe_diff
from vfkit.train.orchestrator import Orchestrator
from vfkit.train.phases import load_data, train
from vfkit.train.rundir import RunDir


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def _adapter(model_path: Path, folder: Path, seed: int) -> Path:
    """A random adapter strong enough to move a tiny model's logprobs (alpha/r = 16)."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=64, target_modules="all-linear",
                                           init_lora_weights=False))
    peft.save_pretrained(folder)
    return folder


def _logprobs(model: torch.nn.Module, ids: list[int], n: int) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -n - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[-n:])[:, None])[:, 0].tolist()


def test_median_over_32_tokens_ignores_bf16_noise_and_catches_another_adapter(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """Real numbers: the same adapter in bf16 (server) vs fp32 (trainer), and a different one."""
    trained = _adapter(tiny_model_path, tmp_path / "a", seed=0)
    other = _adapter(tiny_model_path, tmp_path / "b", seed=1)
    from peft import PeftModel

    def load(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=dtype)
        return PeftModel.from_pretrained(base, folder).eval()

    ids = list(range(10, 10 + 40))
    n = 32
    trainer = _logprobs(load(trained, torch.float32), ids, n)
    server_bf16 = _logprobs(load(trained, torch.bfloat16), ids, n)
    served_other = _logprobs(load(other, torch.float32), ids, n)
    # the tiny model's logprobs are near-uniform (~ -5.5), so differences are small all round:
    # measured bf16 noise ~0.002, another adapter ~0.15; a tolerance between them separates
    probe = Probe(ids[:-n], ids[-n:], server_bf16)
    assert check_probe("run-step1", probe, trainer, tolerance=0.05) < 0.01
    with pytest.raises(AdapterSyncError, match="did not land as trained"):
        check_probe("run-step1", Probe(ids[:-n], ids[-n:], served_other), trainer, 0.05)


def test_one_outlier_token_cannot_decide() -> None:
    server = [-1.0] * 31 + [-4.0]  # one token 3 nats off, as bf16 rounding can make a rare one
    trainer = [-1.05] * 32
    assert probe_diff(Probe([1], list(range(32)), server), trainer) == pytest.approx(0.05)


def test_a_stale_adapter_is_caught_by_its_fingerprint(tiny_model_path: Path, tmp_path) -> None:
    """The server loads last step's file while the trainer saved a new one: the run stops."""
    import train_testing

    with TestServer(train_testing.GroupResponder()) as srv:
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url)
        run = RunDir(tmp_path / cfg.run_name)
        stale = _adapter(tiny_model_path, run.adapter_dir(1), seed=0)
        fresh = _adapter(tiny_model_path, run.adapter_dir(2), seed=1)
        assert fingerprint_dir(stale) != fingerprint_dir(fresh)
        env, rows, _, _ = load_data(cfg, AutoTokenizer.from_pretrained(tiny_model_path))
        with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.args, run=run) as orch:
            assert orch.publish(1, stale, learner=None)["sync/fingerprint_ok"] == 1.0
            real_load = orch.sync.load

            async def load_stale(name: str, path: Path) -> dict:  # a server behind the trainer
                return await real_load(name, stale)

            orch.sync.load = load_stale
            with pytest.raises(AdapterSyncError, match="did not land as trained"):
                orch.publish(2, fresh, learner=None)


@pytest.mark.slow
def test_five_runs_against_a_bf16_server_raise_no_false_alarm(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    import train_testing

    with start_server(str(tiny_model_path), dtype="bfloat16",
                      allowed_adapter_dirs=[str(tmp_path)],
                      extra_args=["--threads", "1"]) as server:
        for seed in range(5):
            cfg = train_testing.tiny_config(
                tiny_model_path, tmp_path, server.base_url, "trainer.args.max_steps=3",
                f"trainer.args.seed={seed}", f'trainer.args.run_name="bf16-{seed}"',
                "trainer.args.adapter_probe_tolerance=0.2",
            )
            rows = train_testing.metrics(train(cfg))
            assert [r["step"] for r in rows] == [1, 2, 3]
            assert all(r["sync/fingerprint_ok"] == 1.0 for r in rows)
