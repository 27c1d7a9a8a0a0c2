"""``every="auto"``: the checkpoint interval read from the job's own ledger, within bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from resiliency.goodput import AutoInterval, ConfigError, advise, read_ledger

from ._simulated_job import simulated_job


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("goodput")
    simulated_job(directory / "train.node0.jsonl", mtbf_s=3600.0, failures=60, seed=4)
    simulated_job(directory / "other.node0.jsonl", mtbf_s=600.0, failures=60, seed=5)
    return directory


def _advised(path: Path) -> int:
    (tier,) = advise(read_ledger([path])).tiers
    steps = tier.steps(tier.advised_interval_s)
    assert steps is not None
    return steps


def test_the_interval_is_advised_from_this_jobs_ledger(
    ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESILIENCY_GOODPUT_DIR", str(ledger_dir))
    monkeypatch.setenv("RESILIENCY_JOB_ID", "train")
    expected = _advised(ledger_dir / "train.node0.jsonl")
    assert expected != _advised(ledger_dir / "other.node0.jsonl")  # the other job differs
    steps, why = AutoInterval(min_steps=10, max_steps=10_000, default_steps=100).steps()
    assert steps == expected and "advised" in why
    narrow = AutoInterval(min_steps=10, max_steps=expected - 50, default_steps=20)
    steps, why = narrow.steps()
    assert steps == expected - 50 and "clamped" in why


def test_the_default_until_the_ledger_can_advise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    auto = AutoInterval(min_steps=5, max_steps=500, default_steps=50)
    monkeypatch.delenv("RESILIENCY_GOODPUT_DIR", raising=False)
    assert auto.steps() == (50, "no ledger of this job yet: the default")
    simulated_job(tmp_path / "train.node0.jsonl", mtbf_s=3600.0, failures=2, seed=1)
    monkeypatch.setenv("RESILIENCY_GOODPUT_DIR", str(tmp_path))
    monkeypatch.setenv("RESILIENCY_JOB_ID", "train")
    steps, why = auto.steps()
    assert steps == 50 and "too few to advise" in why
    assert auto.steps([tmp_path / "missing"])[0] == 50  # unreadable: the default


def test_bounds_are_checked() -> None:
    with pytest.raises(ConfigError, match="min_steps <= default_steps <= max_steps"):
        AutoInterval(min_steps=100, max_steps=10, default_steps=50)
    with pytest.raises(ConfigError, match="tier"):
        AutoInterval(tier="tape")
