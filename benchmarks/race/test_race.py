"""The race's parts, fast: TRL settings translated from vfkit's, the rubric as TRL rewards,
and the wall clock's snapshots.

    PYTHONPATH=$PWD python -m pytest benchmarks/race/test_race.py -q
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import vfkit as vf
from benchmarks.race.clock import Snapshotter, ticks
from benchmarks.race.rewards import rubric_reward_funcs, score_completions
from benchmarks.race.settings import (
    UNBOUNDED_STEPS,
    Leg,
    checkpointing_key,
    run_config,
    trl_config_kwargs,
)
from vfkit.train.phases import with_rollout_sampling
from vfkit.train.policy import lora_config

REPO = Path(__file__).resolve().parents[2]


def leg(tmp_path: Path, env_id: str = "reverse-text", **kw) -> Leg:
    return Leg(system="trl", env_id=env_id, seed=1, budget_s=60, snapshot_every_s=30,
               model="HuggingFaceTB/SmolLM2-135M-Instruct",
               config=str(REPO / "configs" / "exp.toml"), out=str(tmp_path / "leg"), **kw)


def test_trl_gets_the_vfkit_batch_shape_sampling_and_optimizer(tmp_path: Path) -> None:
    from trl import GRPOConfig

    cfg = run_config(leg(tmp_path))
    cfg, sampling = with_rollout_sampling(cfg, vf.load_environment("reverse-text", max_words=2))
    a = cfg.trainer.args
    trl = GRPOConfig(**trl_config_kwargs(a, sampling, [1.0, 0.2], tmp_path / "trl"))
    # exp.toml: 4 prompts x 8 rollouts = 32 completions per optimizer step, micro-batches of 8
    assert (trl.num_generations, trl.generation_batch_size) == (8, 32)
    assert (trl.per_device_train_batch_size, trl.steps_per_generation) == (8, 4)
    assert trl.gradient_accumulation_steps * trl.per_device_train_batch_size == a.batch_size
    assert (trl.max_completion_length, trl.temperature, trl.top_k) == (48, 0.7, 0)
    assert (trl.learning_rate, trl.warmup_steps, trl.lr_scheduler_type.value) == (
        1e-4, 3, "constant_with_warmup")
    assert (trl.adam_beta2, trl.max_grad_norm, trl.beta, trl.loss_type) == (0.99, 1.0, 0.0,
                                                                           "grpo")
    assert trl.reward_weights == [1.0, 0.2] and trl.seed == 1
    assert getattr(trl, checkpointing_key()) is False  # TRL's default is on; exp.toml's off
    # the race's own changes to the config: no step limit, no in-loop eval or checkpoints
    assert (a.max_steps, a.eval_steps, a.save_steps, a.seed) == (UNBOUNDED_STEPS, 0, 0, 1)
    lora = lora_config(a)  # the very LoraConfig both systems get
    assert (lora.r, lora.lora_alpha, lora.target_modules) == (16, 32, "all-linear")


def test_trl_samples_with_the_sampling_args_vfkit_resolved(tmp_path: Path) -> None:
    a = run_config(leg(tmp_path)).trainer.args
    sampling = {"max_tokens": 20, "temperature": 0.5, "top_p": 0.9,
                "extra_body": {"top_k": 5, "min_p": 0.1}}  # as merge_sampling_args writes them
    kwargs = trl_config_kwargs(a, sampling, [1.0], tmp_path)
    picked = {k: kwargs[k] for k in ("max_completion_length", "temperature", "top_p", "top_k",
                                     "min_p", "repetition_penalty")}
    assert picked == {"max_completion_length": 20, "temperature": 0.5, "top_p": 0.9,
                      "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.0}


def test_env_args_follow_the_env(tmp_path: Path) -> None:
    assert run_config(leg(tmp_path)).env.args == {"max_words": 2}  # the race's reverse-text
    other = run_config(leg(tmp_path, "arithmetic", overrides=["trainer.args.max_tokens=32"]))
    assert other.env.args == {} and other.trainer.args.max_tokens == 32


@pytest.mark.parametrize("env_id", ["reverse-text", "arithmetic"])
def test_trl_rewards_are_the_rubric_scores(env_id: str) -> None:
    env = vf.load_environment(env_id, num_train_examples=8, num_eval_examples=4)
    rows = list(env.get_eval_dataset())
    perfect = [[{"role": "assistant", "content": f"<answer>{r['answer']}</answer>"}]
               for r in rows]
    funcs, weights = rubric_reward_funcs(env.rubric, group_size=2)
    columns = {k: [r[k] for r in rows] for k in ("answer", "info", "task")}
    per_func = [f(prompts=[r["prompt"] for r in rows], completions=perfect, **columns)
                for f in funcs]
    assert [f.__name__ for f in funcs] == env.rubric.get_reward_func_names()
    assert per_func == [[1.0] * 4, [1.0] * 4]  # a perfect, well-formed answer: both full
    totals = [s.reward for s in score_completions(env.rubric, rows, perfect, group_size=2)]
    weighted = [sum(w * f[i] for w, f in zip(weights, per_func, strict=True)) for i in range(4)]
    assert weighted == pytest.approx(totals)  # TRL's weighted sum = the rubric's reward


def test_group_reward_functions_see_one_group_at_a_time() -> None:
    def group_size_reward(completions) -> list[float]:
        return [float(len(completions))] * len(completions)

    rubric = vf.Rubric(funcs=[group_size_reward])
    rows = [{"prompt": [{"role": "user", "content": "hi"}]}] * 6
    (func,), _ = rubric_reward_funcs(rubric, group_size=3)
    assert func(prompts=[r["prompt"] for r in rows], completions=["x"] * 6) == [3.0] * 6


def test_ticks_end_at_the_budget() -> None:
    assert ticks(150, 900) == [150, 300, 450, 600, 750, 900]
    assert ticks(150, 800) == [150, 300, 450, 600, 750, 800]
    assert ticks(150, 100) == [100]
    with pytest.raises(ValueError, match="must be > 0"):
        ticks(0, 100)


def write_steps(adapters: Path, stop: threading.Event, keep: int = 2) -> None:
    """A stand-in trainer: a new adapters/step_N every 0.1 s, only the newest `keep` kept."""
    step = 0
    while not stop.is_set():
        step += 1
        folder = adapters / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"step": step}))
        old = adapters / f"step_{step - keep}"
        if old.exists():
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
        stop.wait(0.1)


def test_snapshots_copy_the_newest_adapter_at_each_tick(tmp_path: Path) -> None:
    adapters, stopped = tmp_path / "adapters", threading.Event()
    writer = threading.Thread(target=write_steps, args=(adapters, stopped, 5))
    with Snapshotter(adapters, tmp_path / "snaps", every_s=0.4, budget_s=1.2,
                     on_budget=stopped.set, every_steps=3) as clock:
        writer.start()
        assert stopped.wait(10), "the budget never stopped the run"
        time.sleep(0.3)  # the trainer finishes its step after the stop request
    writer.join()
    record = clock.record()
    assert [s["t_s"] for s in record["snapshots"]] == [0.4, 0.8, 1.2]
    steps = [s["step"] for s in record["snapshots"]]
    assert 0 < steps[0] < steps[1] < steps[2] <= record["steps"][-1][1]
    for snap in record["snapshots"]:  # each copy is the adapter of the step it names
        config = json.loads((Path(snap["path"]) / "adapter_config.json").read_text())
        assert config["step"] == snap["step"]
    times = [t for t, _ in record["steps"]]
    assert times == sorted(times) and times[0] < 0.4
    # and every 3rd step until the budget, each copy the adapter of its step
    by_step = record["step_snapshots"]
    assert [s["step"] for s in by_step] == list(range(3, record["steps"][-1][1] + 1, 3))
    for snap in by_step:
        config = json.loads((Path(snap["path"]) / "adapter_config.json").read_text())
        assert config["step"] == snap["step"] and snap["t_s"] <= 1.2 + 0.3


def test_a_run_that_ends_by_itself_keeps_its_last_step_snapshot(tmp_path: Path) -> None:
    # a leg with max_steps stops before the budget, often within one poll of its last adapter
    adapters = tmp_path / "adapters"
    with Snapshotter(adapters, tmp_path / "snaps", every_s=60, budget_s=60,
                     on_budget=lambda: None, every_steps=2) as clock:
        time.sleep(0.05)  # the clock polls once and finds nothing; the steps then land at once
        for step in range(1, 5):
            (adapters / f"step_{step}").mkdir(parents=True)
            (adapters / f"step_{step}" / "adapter_config.json").write_text("{}")
    record = clock.record()
    assert [s["step"] for s in record["step_snapshots"]] == [2, 4]
    assert record["steps"][-1][1] == 4


def test_a_step_finished_after_the_budget_is_not_counted(tmp_path: Path) -> None:
    # the budget stops the system, which finishes its step first: that step was bought with
    # time past the budget, so neither its time nor its step snapshot may enter the record
    adapters, stopped = tmp_path / "adapters", threading.Event()
    with Snapshotter(adapters, tmp_path / "snaps", every_s=0.3, budget_s=0.3,
                     on_budget=stopped.set, every_steps=1) as clock:
        assert stopped.wait(10), "the budget never stopped the run"
        (adapters / "step_1").mkdir(parents=True)
        (adapters / "step_1" / "adapter_config.json").write_text("{}")
    record = clock.record()
    assert record["steps"] == [] and record["step_snapshots"] == []
    assert [(s["t_s"], s["step"]) for s in record["snapshots"]] == [(0.3, 0)]


def test_equal_step_points_are_the_steps_every_system_of_the_seed_reached() -> None:
    from benchmarks.race.run import shared_steps

    fast = {"step_snapshots": [{"step": n} for n in (10, 20, 30, 40, 50)]}
    slow = {"step_snapshots": [{"step": n} for n in (10, 20, 30)]}
    crashed = {"snapshots": [], "steps": [], "error": "boom"}
    assert shared_steps([fast, slow]) == {10, 20, 30}
    assert shared_steps([fast, slow, crashed]) == set()
    assert shared_steps([fast]) == {10, 20, 30, 40, 50}


def test_scores_are_reused_only_when_taken_the_same_way(tmp_path: Path) -> None:
    from benchmarks.race.run import score_env
    from vfkit.testing.tiny_model import make_tiny_model

    model = str(make_tiny_model(tmp_path / "tiny"))
    tiny = Leg(system="vfkit", env_id="reverse-text", seed=0, budget_s=10, snapshot_every_s=5,
               model=model, config=str(REPO / "configs" / "exp.toml"), out=str(tmp_path / "l"),
               overrides=["trainer.args.max_tokens=4"])
    same = {"task_reward": vf.load_environment("reverse-text").rubric.get_reward_func_names()[0],
            "eval_n": 2, "dtype": "bfloat16"}
    kept = {"t_s": 5, "step": 0, "path": None, "reward": 0.5, "scored_with": same}
    stale = {"t_s": 10, "step": 0, "path": None, "reward": 0.99,
             "scored_with": {**same, "task_reward": "an_older_reward"}}
    records = {tiny.out: {"snapshots": [kept, stale]}}
    base = score_env("reverse-text", [tiny], records, eval_n=2)
    assert kept["reward"] == 0.5  # same reward function, same prompts: not scored again
    assert stale["reward"] == base["reward"] != 0.99 and stale["scored_with"] == same
    assert len(base["sample"]["answer"]) <= 4 * 4  # 4 byte tokens, at most 4 bytes each


@pytest.mark.parametrize(("argv", "named"), [
    (["--envs", "no-such-env"], "no-such-env"),
    (["--set", "trainer.args.no_such_key=1"], "no_such_key"),
    (["--model", "/no/such/model"], "/no/such/model"),
])
def test_bad_input_is_refused_before_anything_runs(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.race.run import main

    assert main(["--out", str(tmp_path), "--config", str(REPO / "configs/exp.toml"), *argv]) == 2
    assert named in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no leg started


def test_a_finished_leg_with_other_settings_is_not_reused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.race.run import main
    from vfkit.testing.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    old = Leg(system="vfkit", env_id="reverse-text", seed=0, budget_s=10, snapshot_every_s=5,
              model=str(model), config=str(REPO / "configs/exp.toml"),
              out=str(tmp_path / "race" / "reverse-text" / "seed0" / "vfkit"))
    old.root.mkdir(parents=True)
    old.dump(old.root / "leg_spec.json")
    old.result_file.write_text(json.dumps({"snapshots": [], "steps": [], "error": None}))
    argv = ["--model", str(model), "--systems", "vfkit", "--budget-s", "20",
            "--snapshot-every-s", "5", "--config", old.config, "--out", str(tmp_path / "race")]
    assert main(argv) == 2
    assert f"{old.root} holds a vfkit leg run with other settings" in capsys.readouterr().err


@pytest.mark.parametrize("vfkit_optimizer", [False, True])
def test_the_control_leg_trains_trl_with_vfkits_optimizer(
    tmp_path: Path, vfkit_optimizer: bool
) -> None:
    from benchmarks.race.test_race_smoke import TINY_SETTINGS
    from benchmarks.race.trl_leg import build_trainer
    from vfkit.testing.tiny_model import make_tiny_model

    tiny = make_tiny_model(tmp_path / "tiny")
    spec = replace(leg(tmp_path, overrides=[*TINY_SETTINGS, "trainer.args.loraplus_lr_ratio=16"]),
                   model=str(tiny))
    trainer = build_trainer(spec, vfkit_optimizer=vfkit_optimizer)
    optimizer = trainer.create_optimizer()
    lrs = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    b_lrs = {lrs[id(p)] for n, p in trainer.model.named_parameters() if "lora_B" in n}
    a_lrs = {lrs[id(p)] for n, p in trainer.model.named_parameters() if "lora_A" in n}
    assert a_lrs == {1e-4}  # exp.toml's learning rate either way
    # TRL's own AdamW has one rate; vfkit's optimizer is LoRA+ as the config asks: B at 16x
    assert b_lrs == ({1.6e-3} if vfkit_optimizer else {1e-4})


def test_trl_trains_on_vfkits_prompts_step_by_step(tmp_path: Path) -> None:
    """A paired race: TRL's sampler hands its trainer, generation batch by generation batch,
    the prompts vf-train's `DataOrder` gives each step for the seed."""
    from benchmarks.race.test_race_smoke import TINY_SETTINGS
    from benchmarks.race.trl_leg import build_trainer
    from vfkit.testing.tiny_model import make_tiny_model
    from vfkit.train.data import DataOrder

    tiny = make_tiny_model(tmp_path / "tiny")
    spec = replace(leg(tmp_path, overrides=TINY_SETTINGS), model=str(tiny), vfkit_order=True)
    trainer = build_trainer(spec)
    a = run_config(spec).trainer.args
    per_step, group = a.prompts_per_batch, a.rollouts_per_example
    sampled = list(trainer._get_train_sampler())  # dataset indices, in the order TRL reads them
    batch = trainer.args.generation_batch_size * trainer.args.steps_per_generation
    ids = trainer.train_dataset["example_id"]
    trl_steps = [[ids[i] for i in sampled[s * batch:s * batch + per_step * group:group]]
                 for s in range(3)]  # each generation batch's prompts, once each
    order = DataOrder(len(set(ids)), per_step, a.seed)
    assert trl_steps == [order.indices(step) for step in (1, 2, 3)]
    assert not trainer.args.shuffle_dataset


def test_a_race_of_step_limited_legs_reports_the_steps_only(tmp_path: Path) -> None:
    # `--set trainer.args.max_steps=10` with a longer budget: every leg ends before the first
    # tick, so there is no wall-clock point; the table must not be an empty, malformed grid
    from benchmarks.race.report import table, write_report

    def record(reward: float) -> dict:
        return {"ticks": [900.0], "snapshots": [], "steps": [[60.0, 10]], "error": None,
                "step_snapshots": [{"t_s": 60.0, "step": 10, "reward": reward}]}

    legs = [Leg(system=system, env_id="arithmetic", seed=seed, budget_s=900,
                snapshot_every_s=900, model="m", config="c", out=f"{system}{seed}")
            for system in ("vfkit", "trl") for seed in (2, 3)]
    records = {leg.out: record(r) for leg, r in zip(legs, (0.6, 0.7, 0.5, 0.6), strict=True)}
    base = {"reward": 0.33, "sample": {"prompt": "Calculate 0 - 2.", "answer": "2"}}
    write_report(tmp_path, legs, records, {"arithmetic": base},
                 {"budget_s": 900, "snapshot_every_s": 900, "eval_n": 100,
                  "eval_dtype": "float32"})
    text = (tmp_path / "results.md").read_text()
    assert "| system |  |" not in text and "No wall-clock snapshot" in text
    assert "| vfkit (vf-train) | 0.650 ±0.050 |" in text
    assert "| TRL GRPOTrainer | 0.550 ±0.050 |" in text
    assert (tmp_path / "arithmetic.png").stat().st_size > 0
    with_clock = [{"system": "vfkit", "seed": 0, "snapshots": [{"t_s": 150.0, "step": 6,
                                                                "reward": 0.4}]}]
    assert "| vfkit (vf-train) | 0.400 (6) |" in table("arithmetic", with_clock, base)


@pytest.mark.parametrize("zero_truncated", [False, True])
def test_trl_scores_a_truncated_completion_0_when_vfkit_would(
    tmp_path: Path, zero_truncated: bool
) -> None:
    """vfkit's `zero_truncated_completions` has no GRPOConfig key: the race hands it to TRL in
    the reward functions, through TRL's own reward path and its own test of truncation."""
    from benchmarks.race.test_race_smoke import TINY_SETTINGS
    from benchmarks.race.trl_leg import build_trainer
    from vfkit.testing.tiny_model import make_tiny_model

    tiny = make_tiny_model(tmp_path / "tiny")
    setting = f"trainer.args.zero_truncated_completions={str(zero_truncated).lower()}"
    spec = replace(leg(tmp_path, "arithmetic", overrides=[*TINY_SETTINGS, setting]),
                   model=str(tiny))
    trainer = build_trainer(spec)
    rows = [trainer.train_dataset[i] for i in range(2)]
    replies = [[{"role": "assistant", "content": f"<answer>{r['answer']}</answer>"}]
               for r in rows]
    eos, text = trainer.eos_token_ids[0], trainer.processing_class.encode("<answer>")
    ids = [[*text, eos], text]  # the first ended; the second was cut at the length limit
    rewards = trainer._calculate_rewards(rows, [r["prompt"] for r in rows], replies, ids)
    assert rewards[0].tolist() == [1.0, 1.0]  # a right, well-formed, finished answer: full
    assert rewards[1].tolist() == ([0.0, 0.0] if zero_truncated else [1.0, 1.0])


def test_trl_reuses_each_batch_as_vfkit_does_and_is_snapshotted_by_batch(tmp_path: Path) -> None:
    """`num_iterations = 2`: TRL takes two optimizer steps on each generation batch, as vfkit
    does, and its adapters are saved by batch (vfkit's step), not by optimizer step."""
    from benchmarks.race.test_race_smoke import TINY_SETTINGS
    from benchmarks.race.trl_leg import SnapshotAdapters, build_trainer
    from vfkit.testing.tiny_model import make_tiny_model
    from vfkit.train.rundir import RunDir

    tiny = make_tiny_model(tmp_path / "tiny")
    reuse = ["trainer.args.num_iterations=2", "trainer.args.max_steps=3",
             "trainer.args.warmup_steps=1"]
    spec = replace(leg(tmp_path, overrides=[*TINY_SETTINGS, *reuse]), model=str(tiny))
    a = run_config(spec).trainer.args
    kwargs = trl_config_kwargs(a, {}, [1.0], tmp_path / "trl")
    assert (kwargs["num_iterations"], kwargs["max_steps"], kwargs["warmup_steps"]) == (2, 6, 2)

    run = RunDir(spec.root / "run")
    clock = Snapshotter(run.adapters, tmp_path / "snaps", every_s=60, budget_s=60,
                        on_budget=lambda: None)
    trainer = build_trainer(spec, callbacks=[SnapshotAdapters(run, clock, threading.Event())])
    generated = []
    generate = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda *x, **k: generated.append(1) or generate(
        *x, **k)
    trainer.train()
    assert trainer.state.global_step == 6 and len(generated) == 3  # 3 batches, 2 steps each
    assert sorted(p.name for p in run.adapters.iterdir()) == ["step_2", "step_3"]
    logged = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    assert [(r["step"], r["optimizer_step"]) for r in logged if "loss" in r] == [
        (0, 1), (1, 2), (1, 3), (2, 4), (2, 5), (3, 6)]
