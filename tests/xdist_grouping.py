"""Keep the tests that share a module-scoped fixture on one pytest-xdist worker.

A module-scoped fixture usually runs a whole job once (a torchrun, a benchmark, a launcher) and
its tests each check one part of the result. ``--dist loadgroup`` (the noxfile's) spreads a
module's tests over every worker, and each worker would then run that job again: four times the
CPU for the same answer on a 2-core machine. So every test of such a module gets the module's
path as its ``xdist_group``; the other tests still spread one by one. A test that names its own
``xdist_group`` keeps it. Without pytest-xdist installed nothing is marked.
"""

from __future__ import annotations

import pytest


def _uses_module_fixture(item: pytest.Item) -> bool:
    # pytest keeps the resolved fixture definitions of a test function in `_fixtureinfo`; there is
    # no public accessor, and items without it (doctests, other plugins' items) take none.
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        fixturedef.scope == "module"
        for fixturedefs in info.name2fixturedefs.values()
        for fixturedef in fixturedefs
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the markers to name the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return  # the marker is xdist's: unregistered (an error under --strict-markers) without it
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _uses_module_fixture(item):
            # The module's path as in the test ids (relative to the root), e.g.
            # "tests/integration/test_bench_smoke.py::test_x@tests/integration/test_bench_smoke.py".
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
