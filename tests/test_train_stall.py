"""The stall warning: steps in a row whose groups all scored alike (nothing to learn) are
named, once, with what usually causes them; the run itself goes on."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from vfkit.testing.scripted_server import TestServer
from vfkit.train.metrics import StallWatch
from vfkit.train.phases import train


@pytest.fixture(autouse=True)
def _train_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "train_envs"))


def _batch(rewards: list[list[float]], advantages: list[list[float]]) -> list[list[dict]]:
    return [[{"reward": r, "advantage": a} for r, a in zip(rs, adv, strict=True)]
            for rs, adv in zip(rewards, advantages, strict=True)]


def test_the_warning_comes_once_per_stall_and_only_after_its_steps() -> None:
    out = io.StringIO()
    watch = StallWatch(Console(file=out, width=400), steps=3)
    alike = _batch([[0.5, 0.5], [0.5, 0.5]], [[0.0, 0.0], [0.0, 0.0]])
    learning = _batch([[1.0, 0.0], [0.5, 0.5]], [[1.0, -1.0], [0.0, 0.0]])
    for step, batch in enumerate([alike, alike, learning, alike, alike], start=1):
        watch.see(step, batch)
    assert out.getvalue() == ""  # two alike, a step with signal, two alike: no stall of 3
    for step in (6, 7, 8):
        watch.see(step, alike)
    text = out.getvalue()
    assert text.count("warning") == 1 and "steps 4-6 learned nothing" in text
    assert "mean reward 0.500" in text and 'ratio_against = "sampler"' in text
    watch.see(9, learning)
    for step in (10, 11, 12):
        watch.see(step, alike)
    assert out.getvalue().count("warning") == 2 and "steps 10-12" in out.getvalue()


def test_a_run_whose_rollouts_all_score_alike_is_warned_and_finishes(
    tiny_model_path: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import train_testing

    with TestServer(lambda body: "aaaa") as srv:  # one answer to every prompt
        cfg = train_testing.tiny_config(tiny_model_path, tmp_path, srv.base_url,
                                        "trainer.args.max_steps=6")
        run_dir = train(cfg)
    err = capfd.readouterr().err
    assert "steps 1-5 learned nothing" in " ".join(err.split())
    assert len(train_testing.metrics(run_dir)) == 6  # warned, not stopped
