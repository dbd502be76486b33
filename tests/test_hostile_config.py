"""Hostile and careless configs: every mistake is a named error (key, line, what to do), the same
in `vf-train` as in `vf-rl --dry-run`, and never a traceback or a run that "succeeds" at nothing.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from vfkit.cli.rl import main as vf_rl
from vfkit.cli.train import main as vf_train
from vfkit.errors import ConfigError
from vfkit.train.config_loader import load_config, parse_config

BASE = 'model = "m"\n[env]\nid = "reverse-text"\n'


@pytest.fixture(autouse=True)
def _keep_signal_handlers():
    """vf-train ignores SIGINT/SIGTERM once it is over: give pytest its handlers back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)

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
    ("server-len-text", '[inference.args]\nmax_model_len = "long"\n', ["max_model_len", ">= 1"]),
    ("epsilon-above-1", "[trainer.args]\nepsilon = 1.5\n", ["epsilon", "less than"]),
    ("warmup-past-end", '[trainer.args]\nmax_steps = 5\nwarmup_steps = 5\n'
     'lr_scheduler_type = "linear"\n', ["x.toml:6", "warmup_steps", "max_steps=5"]),
    ("warmup-without-schedule", "[trainer.args]\nwarmup_steps = 3\n",
     ["x.toml:5", "warmup_steps", '"constant_with_warmup"']),
    ("gpu-share-above-1", "[inference.args]\ngpu_memory_utilization = 1.5\n",
     ["gpu_memory_utilization", "(0, 1]"]),
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
    with pytest.raises(ConfigError) as err:  # a table's error names its key, not the table
        parse_config(BASE + '[inference.args]\ndtype = "x"\napi_key = "sk-secret-3"\n')
    assert "sk-secret-3" not in str(err.value) and "dtype = 'x'" in str(err.value)


# --- the same checks in vf-train and in vf-rl --dry-run (a tiny model, the rl-echo env)


@pytest.fixture
def echo_config(tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from test_rl_helpers import write_config

    path = write_config(tmp_path, tiny_model_path)
    monkeypatch.syspath_prepend(str(tmp_path / "envs"))
    monkeypatch.chdir(tmp_path)
    return path


def _blocker(tmp: Path) -> str:
    (tmp / "a-file").write_text("not a folder")  # root can write anywhere, but not under a file
    return [f"trainer.args.output_dir={tmp}/a-file/outputs"]


# (id, overrides (a callable of tmp_path for paths), words the error must contain)
WORLD_CASES = [
    ("env-args-rejected", ["env.args.no_such_arg=3"], ["load_environment", "no_such_arg"]),
    ("env-unknown", ["env.id=no-such-env"], ["env.id", "'no-such-env' not found"]),
    ("eval-env-unknown", ["env.eval_id=no-such-eval"], ["env.eval_id", "no-such-eval"]),
    ("eval-env-args-rejected", ["env.eval_args.bad=1"], ["**env.eval_args", "'bad'"]),
    ("lora-target-missing", ['trainer.args.lora_target_modules=["q_projj"]'],
     ["lora_target_modules", "'q_projj'", "did you mean 'q_proj'"]),
    ("lora-save-missing", ['trainer.args.lora_modules_to_save=["embed"]'],
     ["lora_modules_to_save", "'embed'"]),
    ("model-missing", ["model=/no/such/model"], ["model", "/no/such/model"]),
    ("output-dir-unwritable", _blocker, ["output_dir", "is not a folder"]),
    ("server-flag-unknown", ["inference.args.no_such_flag=1"],
     ["inference.args.no_such_flag", "builtin server"]),
    ("server-flag-type", ['inference.args.port="x"'], ["inference.args", "--port", "'x'"]),
    ("base-url-down", ["inference.base_url=http://127.0.0.1:9/v1"],
     ["inference.base_url", "/health"]),
    ("batch-far-above-dataset", ["trainer.args.batch_size=4000"],
     ["batch_size=4000", "2000 prompts", "has 16"]),
    ("max-tokens-above-context", ["trainer.args.max_tokens=5000", "trainer.args.max_seq_len=8000"],
     ["max_tokens=5000", "context of 1024", "max_position_embeddings"]),
    ("max-tokens-above-server-context", ["inference.args.max_model_len=64",
                                         "trainer.args.max_tokens=60"],
     ["max_tokens=60", "context of 64", "inference.args.max_model_len"]),
    ("prompt-plus-max-tokens-above-max-seq-len", ["trainer.args.max_tokens=120"],
     ["max_tokens=120", "max_seq_len=128"]),
]


def _overrides(case: object, tmp: Path) -> list[str]:
    return case(tmp) if callable(case) else list(case)  # type: ignore[operator]


@pytest.mark.parametrize(("overrides", "words"), [c[1:] for c in WORLD_CASES],
                         ids=[c[0] for c in WORLD_CASES])
def test_vf_train_names_the_mistake_before_training(
    echo_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    overrides: object, words: list[str],
) -> None:
    code = vf_train([str(echo_config), *_overrides(overrides, tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err
    assert not (tmp_path / "outputs").exists()  # nothing started, nothing written


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "words"), [c[1:] for c in WORLD_CASES],
                         ids=[c[0] for c in WORLD_CASES])
def test_dry_run_names_the_same_mistake(
    echo_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    overrides: object, words: list[str],
) -> None:
    code = vf_rl(["--dry-run", str(echo_config), *_overrides(overrides, tmp_path)])
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("✗")]
    assert code == 1 and len(failed) == 1, out  # exactly the problem we made
    for word in words:
        assert word in failed[0], out


def test_dry_run_measures_prompts_with_the_trainers_function(
    echo_config: Path, capsys: pytest.CaptureFixture[str], tiny_model_path: Path
) -> None:
    from transformers import AutoTokenizer

    from vfkit.envs.registry import load_environment
    from vfkit.train import data, run_checks

    assert run_checks.prompt_length is data.prompt_length  # one owner: imported, not copied
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    prompts = load_environment("rl-echo").get_dataset()["prompt"]
    lengths = [data.prompt_length(tokenizer, p) for p in prompts]
    assert vf_rl(["--dry-run", str(echo_config)]) == 0
    out = capsys.readouterr().out
    assert f"prompts {min(lengths)}-{max(lengths)} tokens" in out, out
    assert f"≈{max(lengths)} prompt" in out  # the plan's token estimate uses the same count


# --- a run that trained nothing is not "done"


def test_a_step_with_nothing_to_train_stops_the_run_loudly(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every prompt too long for the server's context: no completion token, nothing trains."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))
    import train_testing

    from vfkit.errors import VfkitError
    from vfkit.testing.scripted_server import TestServer
    from vfkit.train.phases import train

    with TestServer(train_testing.GroupResponder(), max_context=8) as srv:
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url)
        with pytest.raises(VfkitError, match=r"step 1 trained nothing.*8 prompt_too_long"):
            train(cfg)
    assert not (tmp_path / cfg.run_name / "metrics.jsonl").exists()  # no step reported done


# --- overrides anywhere on the command line (the README's `vf-rl cfg --no-tmux k=v`)

ORDERS = [
    ["CFG", "--no-tmux", "trainer.args.max_steps=5"],
    ["--no-tmux", "CFG", "trainer.args.max_steps=5"],
    ["CFG", "trainer.args.max_steps=5", "--no-tmux"],
    ["CFG", "env.args.n=1", "--no-tmux", "trainer.args.max_steps=5"],
    ["CFG", "--resume", "trainer.args.max_steps=5"],
]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: " ".join(o))
def test_overrides_after_flags_are_accepted(order: list[str]) -> None:
    from vfkit.cli.rl import parse_args as rl_args
    from vfkit.cli.train import parse_args as train_args

    rl = rl_args(order)
    assert rl.config == "CFG" and "trainer.args.max_steps=5" in rl.overrides
    assert rl.no_tmux == ("--no-tmux" in order)
    assert rl.resume == ("latest" if "--resume" in order else None)
    train = train_args([a if a != "--no-tmux" else "--phase=both" for a in order])
    assert train.config == "CFG" and "trainer.args.max_steps=5" in train.overrides


@pytest.mark.parametrize("cli", ["vf-train", "vf-rl"])
def test_override_after_a_flag_reaches_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE)
    flag = "--phase=both" if cli == "vf-train" else "--no-tmux"
    code = (vf_train if cli == "vf-train" else vf_rl)(
        [str(path), flag, "trainer.args.learning_rate=inf"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "command-line override trainer.args.learning_rate" in err and "finite" in err


def test_api_key_override_is_hidden_in_the_printed_plan() -> None:
    from vfkit.launch.plan import format_plan, make_plan

    overrides = ["inference.api_key=sk-secret-2", "trainer.args.max_steps=3"]
    cfg = parse_config(BASE + '[inference]\nbackend = "builtin"\n', overrides=overrides)
    plan = make_plan(cfg, "c.toml", overrides)
    text = format_plan(plan, cfg, "foreground")
    assert "sk-secret-2" not in text
    assert "inference.api_key=***" in text and "trainer.args.max_steps=3" in text
    assert "inference.api_key=sk-secret-2" in plan.trainer.argv  # the trainer still gets it


# --- `make run` inside a tmux session that no client is attached to


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_inside_tmux_with_no_client_says_where_the_run_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vfkit.cli.rl import show_session
    from vfkit.train.rundir import RunDir

    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))  # a private tmux server
    monkeypatch.delenv("TMUX", raising=False)
    for name in ("outer", "vfrun"):  # the session `make run` runs in, and the run's
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "sleep 60"], check=True)
    try:
        socket = next(tmp_path.glob("tmux-*/default"))
        monkeypatch.setenv("TMUX", f"{socket},1,0")  # as inside a pane of "outer"
        run = RunDir(tmp_path / "outputs" / "exp")
        code = show_session("vfrun", run, interactive=True)
    finally:
        subprocess.run(["tmux", "kill-server"], check=False)
    out = capsys.readouterr().out
    assert code == 0
    assert "no current client" in out and "tmux attach -t vfrun" in out
    assert f"run folder: {run.root}" in out


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--health-timeout", "nan"), ("--health-timeout", "0"), ("--stop-timeout", "-5"),
     ("--stop-timeout", "inf"), ("--max-restarts", "-1"), ("--max-restarts", "two")],
)
def test_vf_rl_numeric_flags_are_checked_where_they_enter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE)
    with pytest.raises(SystemExit) as exit_:
        vf_rl([str(path), "--dry-run", f"{flag}={value}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}: '{value}'" in err


def test_config_that_is_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a folder, not a TOML file"):
        load_config(tmp_path)


def test_a_prompt_the_template_cannot_render_is_named_with_its_row(
    echo_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty message list in one row crashed the dry run with the template's traceback."""
    (tmp_path / "envs" / "empty_row.py").write_text(
        "import vfkit as vf\nfrom datasets import Dataset\n\n"
        "def load_environment():\n"
        "    rows = [{'prompt': [{'role': 'user', 'content': 'hi'}], 'answer': 'a'},\n"
        "            {'prompt': [], 'answer': 'a'}]\n"
        "    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows),\n"
        "                            rubric=vf.Rubric(funcs=[lambda completion: 1.0]))\n"
    )
    assert vf_rl(["--dry-run", str(echo_config), "env.id=empty-row"]) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("✗")]
    assert "env.id = 'empty-row'" in line and "row 1" in line and "fix the environment" in line
