"""Restart policies are pure decisions over observed group states."""

from __future__ import annotations

import pytest

from resiliency.launcher.policy import (
    AnyFailedPolicy,
    Decision,
    GroupObservation,
    LocalState,
    MinHealthyPolicy,
    policy_from_name,
)


def obs(local: LocalState, *, nodes=2, failed=0, waiting=0, min_nodes=1, left=1):
    return GroupObservation(local, nodes, failed, waiting, min_nodes, left)


@pytest.mark.parametrize(
    "observation,expected",
    [
        (obs(LocalState.HEALTHY), Decision.CONTINUE),
        (obs(LocalState.SUCCEEDED), Decision.FINISH),
        (obs(LocalState.FAILED), Decision.RESTART),
        (obs(LocalState.FAILED, left=0), Decision.GIVE_UP),
        (obs(LocalState.HEALTHY, failed=1), Decision.REFORM),
        (obs(LocalState.HEALTHY, waiting=1), Decision.REFORM),
    ],
)
def test_any_failed(observation: GroupObservation, expected: Decision):
    assert AnyFailedPolicy().decide(observation) is expected


@pytest.mark.parametrize(
    "observation,expected",
    [
        # 2 nodes, MIN 1: a failed node steps aside, the healthy one keeps going.
        (obs(LocalState.FAILED, nodes=2, min_nodes=1), Decision.STANDBY),
        (obs(LocalState.HEALTHY, nodes=2, failed=1, min_nodes=1), Decision.CONTINUE),
        # new nodes waiting do not interrupt a healthy group
        (obs(LocalState.HEALTHY, nodes=2, waiting=1, min_nodes=1), Decision.CONTINUE),
        # too few healthy: the failed node restarts (charged), the healthy one re-forms (not)
        (obs(LocalState.FAILED, nodes=2, min_nodes=2), Decision.RESTART),
        (obs(LocalState.FAILED, nodes=2, min_nodes=2, left=0), Decision.GIVE_UP),
        (obs(LocalState.HEALTHY, nodes=2, failed=1, min_nodes=2), Decision.REFORM),
        (obs(LocalState.FAILED, nodes=3, failed=1, min_nodes=2), Decision.RESTART),
        (obs(LocalState.FAILED, nodes=1, min_nodes=1), Decision.RESTART),
        (obs(LocalState.SUCCEEDED, nodes=2, failed=1), Decision.FINISH),
    ],
)
def test_min_healthy(observation: GroupObservation, expected: Decision):
    assert MinHealthyPolicy().decide(observation) is expected


def test_healthy_nodes_counts_this_node():
    assert obs(LocalState.FAILED, nodes=3, failed=1).healthy_nodes == 1
    assert obs(LocalState.HEALTHY, nodes=3, failed=1).healthy_nodes == 2
    assert obs(LocalState.HEALTHY, nodes=1, failed=5).healthy_nodes == 0


def test_policy_from_name():
    assert isinstance(policy_from_name("any-failed"), AnyFailedPolicy)
    assert isinstance(policy_from_name("MIN_HEALTHY"), MinHealthyPolicy)
    with pytest.raises(ValueError, match="min-healthy"):
        policy_from_name("most-healthy")
