"""Every config key takes effect: one check per key, and a test that no key lacks a check
(the optimizer, LoRA, loss and advantage keys are in test_train_keys_learner.py).

Checks talk to the scripted TestServer over real HTTP, build a Learner on the tiny model, or
call the function that reads the key, and assert the value changed what it should.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel
from rich.console import Console

from vfkit.errors import AdapterSyncError, ConfigError, VfkitError
from vfkit.testing.scripted_server import TestServer
from vfkit.train.batches import Batch
from vfkit.train.config import RunConfig
from vfkit.train.config_loader import world_size
from vfkit.train.data import DataOrder, dataset_rows
from vfkit.train.learner import Learner
from vfkit.train.loop import train_on
from vfkit.train.metrics import MetricsLogger
from vfkit.train.orchestrator import Orchestrator
from vfkit.train.phases import load_data, train
from vfkit.train.placement import device_ids, flag_args, inference_server, launcher_kwargs
from vfkit.train.rundir import RunDir
from vfkit.train.samples import Sample

torch.set_num_threads(2)
CHECKS: dict[str, Callable[..., None]] = {}


def check(*keys: str):
    def register(fn):
        for key in keys:
            CHECKS[key] = fn
        return fn

    return register


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


class Ctx:
    """What a check needs: the tiny model, a scratch dir, and a config builder."""

    def __init__(self, model: Path, tmp: Path) -> None:
        self.model, self.tmp = model, tmp

    def cfg(self, *overrides: str, base_url: str = "") -> RunConfig:
        import train_testing

        return train_testing.tiny_config(self.model, self.tmp, base_url, *overrides)

    def learner(self, *overrides: str) -> Learner:
        cfg = self.cfg(*overrides)
        run = RunDir(self.tmp / cfg.run_name)
        run.root.mkdir(parents=True, exist_ok=True)
        return Learner(cfg, run)

    def batch(self, *overrides: str, responder=None) -> tuple[Batch, list[dict]]:
        """Generate batch 1 through the TestServer; return it and the request bodies."""
        import train_testing

        with TestServer(responder or train_testing.GroupResponder()) as srv:
            cfg = self.cfg(*overrides, base_url=srv.base_url)
            env, rows, _, _ = load_data(cfg, _tokenizer(self.model))
            with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.args,
                              run=RunDir(self.tmp / cfg.run_name)) as orch:
                orch.submit(1)
                batch = orch.get(1)
            return batch, list(srv.requests)

    def run(self, *overrides: str, **server_kw) -> Path:
        import train_testing

        with TestServer(train_testing.GroupResponder(), **server_kw) as srv:
            return train(self.cfg(*overrides, base_url=srv.base_url))


def _tokenizer(model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _samples(n: int = 4, length: int = 12) -> list[Sample]:
    """n samples of growing length, 4 prompt tokens each, alternating advantages."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        length += 2 * (i > 0)
        ids = torch.randint(3, 200, (length,), generator=g).tolist()
        mask = [0] * 4 + [1] * (length - 4)
        out.append(Sample(ids, mask, [-5.5 if m else 0.0 for m in mask], 1.0 if i % 2 else -1.0))
    return out


def _metrics(run_dir: Path) -> list[dict]:
    import train_testing

    return train_testing.metrics(run_dir)


def _state(reward: float, ids=(1, 2), completion=(3, 4), truncated=False) -> dict:
    tokens = {"prompt_ids": list(ids), "prompt_mask": [0] * len(ids),
              "completion_ids": list(completion), "completion_mask": [1] * len(completion),
              "completion_logprobs": [-0.1] * len(completion), "overlong_prompt": False,
              "is_truncated": truncated}
    return {"reward": reward, "is_truncated": truncated, "trajectory": [{"tokens": tokens}]}


class Recorder:
    """Stands in for the Learner in `train_on`: records the samples it is given."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def update(self, samples: list[Sample]) -> dict:
        self.samples = samples
        return {}


def _train_on(groups: list[list[dict]], *overrides: str, ctx: Ctx) -> list[Sample]:
    rec = Recorder()
    train_on(Batch(1, 0, groups), rec, ctx.cfg(*overrides).args)
    return rec.samples


# ----------------------------------------------------------------------------- top level, env
@check("model")
def _model(ctx: Ctx) -> None:
    from vfkit.testing.tiny_model import make_tiny_model

    other = make_tiny_model(ctx.tmp / "wide", hidden_size=32)
    cfg = ctx.cfg(f'model="{other}"')
    learner = Learner(cfg, ctx.tmp)
    assert learner.peft_model.config.hidden_size == 32


@check("env.id", "env.args")
def _env(ctx: Ctx) -> None:
    env, rows, _, _ = load_data(ctx.cfg("env.args.num_examples=5"), _tokenizer(ctx.model))
    assert env.env_id == "train-letter-a" and len(rows) == 5


@check("env.eval_id", "env.eval_args")
def _eval_env(ctx: Ctx) -> None:
    tok = _tokenizer(ctx.model)
    _, _, eval_env, eval_rows = load_data(
        ctx.cfg("trainer.args.eval_steps=1", 'env.eval_id="reverse-text"',
                "env.eval_args.num_eval_examples=3", "trainer.args.max_prompt_len=400",
                "trainer.args.max_seq_len=512"), tok)
    assert eval_env.env_id == "reverse-text" and len(eval_rows) == 3
    _, _, _, eval_rows = load_data(
        ctx.cfg("trainer.args.eval_steps=1", "env.eval_args.letters='b'"), tok)
    assert eval_rows[0]["answer"] == "b"


# ----------------------------------------------------------------------------- inference
@check("inference.backend", "inference.host", "inference.port", "inference.args")
def _launcher(ctx: Ctx) -> None:
    cfg = ctx.cfg('inference.backend="builtin"', 'inference.host="0.0.0.0"', "inference.port=8123",
                  "inference.args.max_lora_rank=32", "inference.args.enforce_eager=true")
    kw = launcher_kwargs(cfg, RunDir(ctx.tmp))
    assert (kw["backend"], kw["host"], kw["port"], kw["max_lora_rank"]) == (
        "builtin", "0.0.0.0", 8123, 32)
    assert "--enforce-eager" in kw["extra_args"] and "--max-lora-rank" not in kw["extra_args"]
    assert flag_args({"gpu_memory_utilization": 0.5, "x": False}) == [
        "--gpu-memory-utilization", "0.5"]


@check("inference.gpus", "trainer.gpus")
def _gpus(ctx: Ctx) -> None:
    """The ids become each process's CUDA_VISIBLE_DEVICES: tests/test_train_devices.py."""
    from vfkit.cli.train import relaunch

    cfg = ctx.cfg("inference.gpus=1", "trainer.gpus=2", "trainer.args.batch_size=16")
    assert device_ids(cfg) == ([0], [1, 2]) and world_size(cfg) == 2
    argv, env = relaunch(cfg, ["c.toml"])
    assert argv[argv.index("--num_processes") + 1] == "2" and argv[-2:] == ["vfkit.cli.train",
                                                                             "c.toml"]
    assert env["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert device_ids(ctx.cfg("inference.gpus=[3]", "trainer.gpus=[5]")) == ([3], [5])
    with pytest.raises(ConfigError, match="8 × 2"):
        ctx.cfg("trainer.gpus=2", "trainer.args.micro_batch_size=8")


@check("inference.base_url")
def _base_url(ctx: Ctx) -> None:
    cfg = ctx.cfg(base_url="http://127.0.0.1:9/v1/")
    with inference_server(cfg, ctx.model, RunDir(ctx.tmp)) as server:  # nothing is started
        assert server.base_url == "http://127.0.0.1:9/v1" and server.failure() is None


@check("inference.api_key")
def _api_key(ctx: Ctx) -> None:
    run_dir = ctx.run('inference.api_key="sekret"', "trainer.args.max_steps=1",
                      api_key="sekret")  # the server answers 401 without it
    assert _metrics(run_dir)[0]["errors"] == 0
    assert "sekret" not in (run_dir / "config.toml").read_text()


# ----------------------------------------------------------------------------- sampling
@check("trainer.args.rollouts_per_example", "trainer.args.batch_size")
def _batch_shape(ctx: Ctx) -> None:
    batch, _ = ctx.batch("trainer.args.rollouts_per_example=2", "trainer.args.batch_size=12")
    assert [len(g) for g in batch.groups] == [2] * 6


@check("trainer.args.max_tokens", "trainer.args.temperature", "trainer.args.top_p",
       "trainer.args.top_k", "trainer.args.min_p", "trainer.args.repetition_penalty")
def _sampling(ctx: Ctx) -> None:
    _, requests = ctx.batch(
        "trainer.args.max_tokens=5", "trainer.args.temperature=0.7", "trainer.args.top_p=0.9",
        "trainer.args.top_k=20", "trainer.args.min_p=0.05", "trainer.args.repetition_penalty=1.1")
    body = requests[0]
    assert (body.get("max_tokens") or body.get("max_completion_tokens")) == 5
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (
        0.7, 0.9, 20, 0.05)
    assert body["repetition_penalty"] == 1.1 and body["return_token_ids"] is True
    # the trainer scores tokens at the sampling temperature too
    sample = _samples(1)
    lps = [ctx.learner(f"trainer.args.temperature={t}").update(sample)["entropy"]
           for t in (1.0, 0.5)]
    assert lps[0] != pytest.approx(lps[1])


@check("trainer.args.max_concurrent")
def _max_concurrent(ctx: Ctx) -> None:
    import train_testing

    def most_at_once(*overrides: str) -> int:
        with TestServer(train_testing.GroupResponder()) as srv:
            srv.delay_next(0.4, n=8)  # held, so that all the client lets go overlap
            cfg = ctx.cfg("trainer.args.rollouts_per_example=2", *overrides, base_url=srv.base_url)
            env, rows, _, _ = load_data(cfg, _tokenizer(ctx.model))
            with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.args,
                              run=RunDir(ctx.tmp / cfg.run_name)) as orch:
                orch.submit(1)
                orch.get(1)
            return srv.max_in_flight

    # 4 groups of 2: all at once, or one whole group at a time
    assert most_at_once() == 8
    assert most_at_once("trainer.args.max_concurrent=2") == 2


@check("trainer.args.generation_timeout")
def _generation_timeout(ctx: Ctx) -> None:
    import train_testing

    with TestServer(train_testing.GroupResponder()) as srv:
        srv.delay_next(2.0, n=8)
        cfg = ctx.cfg("trainer.args.generation_timeout=0.3", base_url=srv.base_url)
        env, rows, _, _ = load_data(cfg, _tokenizer(ctx.model))
        with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.args,
                              run=RunDir(ctx.tmp / cfg.run_name)) as orch:
            orch.submit(1)
            with pytest.raises(VfkitError, match="generation_timeout"):
                orch.get(1)


@check("trainer.args.max_prompt_len", "trainer.args.max_seq_len")
def _lengths(ctx: Ctx) -> None:
    tok = _tokenizer(ctx.model)
    env, rows, _, _ = load_data(
        ctx.cfg("trainer.args.max_seq_len=64", "trainer.args.max_prompt_len=60"), tok)
    assert env.max_seq_len == 64
    rows, dropped = dataset_rows(env.get_dataset(), tok, max_prompt_len=20)
    assert (len(rows), dropped) == (0, 16)  # every chat prompt is longer than 20 byte-tokens
    group = [_state(1.0, ids=range(40)), _state(0.0, ids=range(40))]
    assert len(_train_on([group], ctx=ctx)) == 2  # 42 tokens fit max_seq_len=128
    cut = _train_on([group], "trainer.args.max_seq_len=41", "trainer.args.max_prompt_len=10",
                    ctx=ctx)
    assert cut == []  # over max_seq_len: dropped, never cut


# ----------------------------------------------------------------------------- loop
@check("trainer.args.max_steps", "trainer.args.async_level", "trainer.args.save_steps",
       "trainer.args.save_total_limit")
def _loop(ctx: Ctx) -> None:
    run_dir = ctx.run("trainer.args.max_steps=3", "trainer.args.async_level=0",
                      "trainer.args.save_steps=1", "trainer.args.save_total_limit=2")
    rows = _metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2, 3]
    assert [m["policy/lag"] for m in rows] == [0, 0, 0]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2", "step_3"]


@check("trainer.args.eval_steps", "trainer.args.eval_num_examples")
def _eval(ctx: Ctx) -> None:
    run_dir = ctx.run("trainer.args.max_steps=3", "trainer.args.eval_steps=2",
                      "trainer.args.eval_num_examples=3")
    evals = [m["step"] for m in _metrics(run_dir) if "eval/reward/mean" in m]
    assert evals == [0, 2, 3]  # at start, every 2 steps, at the end
    _, _, _, rows = load_data(ctx.cfg("trainer.args.eval_steps=1",
                                      "trainer.args.eval_num_examples=3"), _tokenizer(ctx.model))
    assert len(rows) == 3


@check("trainer.args.output_dir", "trainer.args.run_name", "trainer.args.report_to")
def _outputs(ctx: Ctx) -> None:
    run_dir = ctx.run("trainer.args.max_steps=1", 'trainer.args.run_name="named"',
                      'trainer.args.report_to=["tensorboard"]')
    assert run_dir == ctx.tmp / "named"
    assert (run_dir / "metrics.jsonl").read_text()  # the run's record, trackers or not
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


@check("trainer.args.logging_steps")
def _logging_steps(ctx: Ctx) -> None:
    out = io.StringIO()
    log = MetricsLogger(ctx.tmp, report_to=[], logging_steps=3, max_steps=7, run_name="r",
                        config={}, console=Console(file=out, width=200))
    for step in range(1, 8):
        log.log(step, {"reward/mean": 0.5})
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["3/7", "6/7", "7/7"]


@check("trainer.args.seed")
def _seed(ctx: Ctx) -> None:
    assert DataOrder(16, 2, seed=0).indices(1) != DataOrder(16, 2, seed=1).indices(1)
    a, b = ctx.learner("trainer.args.seed=0"), ctx.learner("trainer.args.seed=1")
    wa, wb = a.lora_weights(), b.lora_weights()
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)


@check("trainer.args.sync_timeout", "trainer.args.adapter_probe_tolerance")
def _sync(ctx: Ctx) -> None:
    import train_testing

    with TestServer(train_testing.GroupResponder()) as srv:
        cfg = ctx.cfg("trainer.args.sync_timeout=7", base_url=srv.base_url)
        env, rows, _, _ = load_data(cfg, _tokenizer(ctx.model))
        with Orchestrator(env, rows, base_url=srv.base_url, args=cfg.args,
                              run=RunDir(ctx.tmp / cfg.run_name)) as orch:
            assert orch.sync.http.timeout.read == 7
    # the probe decides only where the server reports no fingerprint (vLLM): make the scripted
    # server such a one. inf: no probe; finite: its constant logprobs cannot match the model
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("vfkit.lora_fingerprint.fingerprint_dir", lambda _folder: None)
        ctx.run("trainer.args.max_steps=1")
        with pytest.raises(AdapterSyncError, match="did not land as trained"):
            ctx.run("trainer.args.max_steps=1", "trainer.args.adapter_probe_tolerance=0.1",
                    'trainer.args.run_name="probe"')


# ----------------------------------------------------------------------------- coverage
def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _leaf_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def test_every_config_key_has_a_check() -> None:
    import test_train_keys_learner  # noqa: F401  (registers the optimizer/LoRA/loss checks)

    assert sorted(_leaf_keys(RunConfig)) == sorted(CHECKS)


def params(module: str) -> list:
    """One test per check function of `module`, named after the keys it covers."""
    keys_of: dict[Callable, list[str]] = {}
    for key, fn in CHECKS.items():
        if fn.__module__ == module:
            keys_of.setdefault(fn, []).append(key.rsplit(".", 1)[-1])
    return [
        pytest.param(fn, id="+".join(keys))
        for fn, keys in keys_of.items()
    ]


@pytest.mark.parametrize("check_fn", params(__name__))
def test_key_takes_effect(check_fn: Callable, tiny_model_path: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    check_fn(Ctx(tiny_model_path, tmp_path))
    assert time.monotonic() - started < 120
