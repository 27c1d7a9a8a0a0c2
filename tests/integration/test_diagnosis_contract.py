"""The launcher's failure classes and decisions are the ones the goodput schema documents.

The launcher writes ``diagnosis`` events through ``resiliency.goodput``'s recorder; the schema
lists the classes and decisions for the reference in docs/goodput.md. Neither imports the other's
list, so this test checks the two sides against each other (issue 28).
"""

from __future__ import annotations

import inspect

from resiliency.goodput.schema import DECISIONS, EVENT_TYPES, FAILURE_CLASSES
from resiliency.launcher import FailureClass
from resiliency.launcher._goodput_events import GoodputEvents
from resiliency.launcher.stop_rules import Action


def test_every_class_the_launcher_records_is_documented_in_the_schema():
    recorded = {c.value for c in FailureClass} - {"unknown"}  # unknown is never recorded
    assert recorded == set(FAILURE_CLASSES)


def test_every_decision_is_documented_in_the_schema():
    assert {a.value for a in Action} == set(DECISIONS)


def test_the_launchers_diagnosis_fields_are_the_schemas():
    # The recorder adds the cycle number itself.
    fields = set(inspect.signature(GoodputEvents.diagnosis).parameters) - {"self"} | {"cycle"}
    assert fields == set(EVENT_TYPES["diagnosis"])
