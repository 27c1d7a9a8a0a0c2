"""resiliency.goodput: the goodput event ledger, its writer, and the calculator.

Stdlib only; matplotlib (the ``plot`` extra) only to draw timelines. See ``docs/goodput.md``.
"""

from resiliency.goodput.advice import (
    Advice,
    TierAdvice,
    advise,
    daly_interval,
    predicted_goodput,
    young_interval,
)
from resiliency.goodput.auto_interval import AutoInterval
from resiliency.goodput.calculator import CATEGORIES, Breakdown, Report, compute
from resiliency.goodput.errors import ConfigError, GoodputError, MissingDependencyError
from resiliency.goodput.ledger import Event, Ledger, LedgerReader, read_ledger
from resiliency.goodput.recorder import (
    DIR_ENV,
    JOB_ID_ENV,
    Recorder,
    get_recorder,
    host_ledger_files,
    ledger_path,
)
from resiliency.goodput.schema import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    render_schema_reference,
    validate_event,
)

__all__ = [
    "CATEGORIES",
    "DIR_ENV",
    "EVENT_TYPES",
    "JOB_ID_ENV",
    "SCHEMA_VERSION",
    "Advice",
    "AutoInterval",
    "Breakdown",
    "ConfigError",
    "Event",
    "GoodputError",
    "Ledger",
    "LedgerReader",
    "MissingDependencyError",
    "Recorder",
    "Report",
    "TierAdvice",
    "advise",
    "compute",
    "daly_interval",
    "get_recorder",
    "host_ledger_files",
    "ledger_path",
    "predicted_goodput",
    "read_ledger",
    "render_schema_reference",
    "validate_event",
    "young_interval",
]
