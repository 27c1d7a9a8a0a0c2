"""The stop rules after a failed cycle, rule by rule (issue 28): repeated failure, configuration
error on the first attempt, restart storm, GPU hardware on this node."""

from __future__ import annotations

from resiliency.launcher.failure_classes import RULES, CycleEvidence, RankEvidence, classify
from resiliency.launcher.stop_rules import _REPEAT_BY_NATURE, Action, StopRules


def _crash(rank: int, exc: str, message: str, node: int = 0) -> RankEvidence:
    return RankEvidence(rank=rank, node=node, exitcode=1, exc_type=exc, message=message)


def _ev(*ranks: RankEvidence, attempt: int = 1) -> CycleEvidence:
    return CycleEvidence(node=0, attempt=attempt, ranks={r.rank: r for r in ranks})


def _rules(**kw) -> StopRules:
    return StopRules(0, kw.get("repeat", 3), kw.get("storm", 0), kw.get("window", 600.0))


def test_the_same_failure_three_times_stops():
    rules = _rules()
    crash = classify(_ev(_crash(1, "ValueError", "bad batch at step 3")))
    actions = [rules.decide(crash, now=float(i)).action for i in range(3)]
    assert actions == [Action.RESTART, Action.RESTART, Action.STOP]
    decision = rules.decide(crash, now=4.0)
    assert decision.rule == "repeated" and "ValueError: bad batch at step 3" in decision.reason


def test_a_different_step_or_culprit_resets_the_count():
    rules = _rules()
    decide = [
        classify(_ev(_crash(1, "ValueError", "bad batch at step 3"))),
        classify(_ev(_crash(1, "ValueError", "bad batch at step 3"))),
        classify(_ev(_crash(1, "ValueError", "bad batch at step 9"))),  # progress: a later step
        classify(_ev(_crash(0, "ValueError", "bad batch at step 9"))),  # another culprit
    ]
    assert [rules.decide(v, now=float(i)).action for i, v in enumerate(decide)] == [
        Action.RESTART
    ] * 4


def test_zero_never_stops_on_repeats():
    rules = _rules(repeat=0)
    crash = classify(_ev(_crash(1, "ValueError", "x")))
    assert {rules.decide(crash, now=float(i)).action for i in range(6)} == {Action.RESTART}


def test_a_config_error_stops_on_the_first_attempt_only():
    missing = _crash(1, "ModuleNotFoundError", "No module named 'apex'")
    first = _rules().decide(classify(_ev(missing, attempt=0)), now=0.0)
    assert first.action is Action.STOP and first.rule == "config_first_attempt"
    later = _rules().decide(classify(_ev(missing, attempt=2)), now=0.0)
    assert later.action is Action.RESTART


def test_a_restart_storm_stops():
    rules = _rules(storm=3, window=60.0)
    kinds = ["A", "B", "C", "D"]
    actions = [
        rules.decide(classify(_ev(_crash(1, "ValueError", k))), now=10.0 * i).action
        for i, k in enumerate(kinds)
    ]
    assert actions == [Action.RESTART] * 3 + [Action.STOP]
    slow = _rules(storm=3, window=60.0)
    spaced = [
        slow.decide(classify(_ev(_crash(1, "ValueError", k))), now=40.0 * i).action
        for i, k in enumerate(kinds)
    ]
    assert spaced == [Action.RESTART] * 4


def test_gpu_hardware_on_this_node_restarts_without_it():
    ecc = _crash(1, "RuntimeError", "uncorrectable ECC error encountered", node=0)
    decision = _rules().decide(classify(_ev(ecc)), now=0.0)
    assert decision.action is Action.RESTART_WITHOUT_NODE
    elsewhere = StopRules(1, 3, 0, 600.0).decide(classify(_ev(ecc)), now=0.0)
    assert elsewhere.action is Action.RESTART


def test_a_repeated_failure_with_progress_in_between_goes_on():
    # The same SimulatedCrash of rank 1 three times, but the job's ledger gained steps in
    # between: a recurring fault of a progressing job, not a deterministic one.
    rules = _rules()
    crash = classify(_ev(_crash(1, "SimulatedCrash", "crash injected by resiliency-simulate")))
    actions = [rules.decide(crash, now=float(i), progress=10 * i).action for i in range(4)]
    assert actions == [Action.RESTART] * 4
    # ... and once it stops progressing, three failures at the same step stop it.
    actions = [rules.decide(crash, now=5.0 + i, progress=40).action for i in range(3)]
    assert actions == [Action.RESTART, Action.RESTART, Action.STOP]


def test_without_progress_only_failures_that_repeat_by_nature_count():
    killed = RankEvidence(rank=1, node=0, exitcode=-9)  # SIGKILL
    kill = classify(_ev(killed))
    rules = _rules()
    assert {rules.decide(kill, now=float(i)).action for i in range(5)} == {Action.RESTART}
    exited = classify(_ev(RankEvidence(rank=1, node=0, exitcode=3)))
    rules = _rules()
    assert {rules.decide(exited, now=float(i)).action for i in range(5)} == {Action.RESTART}
    nan = classify(_ev(_crash(1, "FloatingPointError", "loss is nan at step 7")))
    rules = _rules()
    assert [rules.decide(nan, now=float(i)).action for i in range(3)][-1] is Action.STOP


def test_the_rules_that_repeat_by_nature_are_rules_of_the_table():
    assert {rule.name for rule in RULES} >= _REPEAT_BY_NATURE
