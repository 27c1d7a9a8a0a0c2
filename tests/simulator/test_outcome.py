"""What a fault did, read from the ledger: also for a launcher that writes no events."""

from __future__ import annotations

import pytest

from resiliency.simulator import Fault, Injection, outcomes

T0 = 1_000.0


def _kill_at(t: float) -> Injection:
    return Injection(Fault(at_s=t - T0, kind="kill", victim=1, seed=0), 0.0, t, "rank 1", "SIGKILL")


def test_torchrun_restarts_are_seen_through_the_workers() -> None:
    # No cycle or hang events: the workers' load after the restart is the first sign of it.
    timeline = [(T0 + 1 + s, {"event": "step", "step": s, "attempt": 0}) for s in range(1, 10)]
    timeline.append((T0 + 20, {"event": "checkpoint_load_started", "tier": "persistent"}))
    timeline.append((T0 + 21, {"event": "checkpoint_loaded", "step": 5}))
    timeline += [(T0 + 16 + s, {"event": "step", "step": s, "attempt": 1}) for s in range(6, 9)]
    (row,) = outcomes([_kill_at(T0 + 10.5)], sorted(timeline, key=lambda p: p[0]), T0)
    assert (row.detected_s, row.recovered_s, row.steps_lost) == (20.0, 22.0, 4)


def test_a_step_under_another_restart_count_is_a_detection() -> None:
    timeline = [(T0 + s, {"event": "step", "step": s, "attempt": 0}) for s in range(1, 6)]
    timeline += [(T0 + 10 + s, {"event": "step", "step": s, "attempt": 1}) for s in (1, 2)]
    (row,) = outcomes([_kill_at(T0 + 5.5)], timeline, T0)
    assert (row.detected_s, row.recovered_s) == (11.0, 11.0)


def test_a_preempted_job_recovers_at_the_first_step_after_it_starts_again() -> None:
    timeline = [(T0 + s, {"event": "step", "step": s, "attempt": 0}) for s in range(1, 6)]
    timeline += [
        (T0 + 5.2, {"event": "preempted", "step": 6}),
        (T0 + 5.3, {"event": "step", "step": 6, "attempt": 0}),  # the step it stopped at
        (T0 + 6.0, {"event": "cycle_ended", "cause": "preemption"}),
        (T0 + 20.0, {"event": "cycle_started", "cycle": 0}),
        (T0 + 25.0, {"event": "checkpoint_loaded", "step": 6}),
        (T0 + 26.0, {"event": "step", "step": 7, "attempt": 0}),
    ]
    (row,) = outcomes([_kill_at(T0 + 5.1)], timeline, T0)
    assert row.detected_s == pytest.approx(5.2)
    assert (row.recovered_s, row.steps_lost) == (26.0, 0)


def test_a_fault_before_the_first_step_is_not_detected_by_that_step() -> None:
    # On a loaded machine the fault can land while the job is still starting: its first step
    # (same restart count) is no restart; the hang seen later is the detection.
    timeline = [
        (T0 + 1.0, {"event": "cycle_started", "cycle": 0}),
        (T0 + 9.1, {"event": "step", "step": 1, "attempt": 0}),
        (T0 + 20.0, {"event": "hang_detected", "rank": 1}),
        (T0 + 21.0, {"event": "cycle_ended", "cause": "hang"}),
        (T0 + 22.0, {"event": "cycle_started", "cycle": 1}),
        (T0 + 25.0, {"event": "step", "step": 1, "attempt": 1}),
    ]
    (row,) = outcomes([_kill_at(T0 + 9.0)], timeline, T0)
    assert (row.detected_s, row.recovered_s) == (20.0, 25.0)


def test_an_in_process_restart_is_the_detection_and_its_heal_the_resumed_step() -> None:
    # A rank SIGKILLed and respawned alone under ft-launcher --ft-inprocess-respawn: no cycle
    # ends; the Wrapper's restart event is the detection, the heal names the step resumed at.
    timeline = [(T0 + s, {"event": "step", "step": s, "attempt": 0}) for s in range(1, 9)]
    timeline += [
        (T0 + 8.6, {"event": "inprocess_restart", "cause": "peer_fault", "iteration": 1}),
        (T0 + 8.7, {"event": "inprocess_heal", "step": 8, "lost_steps": 0, "iteration": 1}),
        (T0 + 9.0, {"event": "step", "step": 9, "attempt": 0}),
    ]
    (row,) = outcomes([_kill_at(T0 + 8.5)], timeline, T0)
    assert row.detected_s == pytest.approx(8.6)
    assert (row.recovered_s, row.steps_lost) == (9.0, 0)


def test_an_in_process_rollback_counts_the_steps_done_again() -> None:
    timeline = [(T0 + s, {"event": "step", "step": s, "attempt": 0}) for s in range(1, 8)]
    timeline += [
        (T0 + 7.6, {"event": "inprocess_restart", "cause": "exception", "iteration": 1}),
        (T0 + 7.7, {"event": "inprocess_rollback", "step": 6, "lost_steps": 1, "iteration": 1}),
        (T0 + 8.0, {"event": "step", "step": 7, "attempt": 0}),
    ]
    (row,) = outcomes([_kill_at(T0 + 7.5)], timeline, T0)
    assert row.detected_s == pytest.approx(7.6)
    assert (row.recovered_s, row.steps_lost) == (8.0, 1)
