"""The declared torch floor is the version CI tests, everywhere it is stated."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resiliency.launcher._torch_compat import MIN_TORCH, TESTED_TORCH

_ROOT = Path(__file__).resolve().parents[2]


# A quoted requirement on torch itself (not torchvision, not a description that names torch);
# a regex rather than tomllib, which Python 3.10 lacks.
_TORCH_REQUIREMENT = re.compile(r'"(torch\s*(?:[<>=!~;\[][^"]*)?)"')


def _torch_requirements() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for pyproject in sorted(_ROOT.glob("packages/*/pyproject.toml")):
        reqs = _TORCH_REQUIREMENT.findall(pyproject.read_text(encoding="utf-8"))
        if reqs:
            found[pyproject.parent.name] = reqs
    return found


def test_the_floor_is_the_oldest_tested_version() -> None:
    assert min(TESTED_TORCH) == MIN_TORCH


@pytest.mark.parametrize("package", ["checkpoint", "ft-launcher", "inprocess", "supervisor"])
def test_every_package_that_needs_torch_declares_the_floor(package: str) -> None:
    floor = f"torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}"
    assert _torch_requirements().get(package) == [floor]


def test_no_other_package_declares_a_torch_floor() -> None:
    assert set(_torch_requirements()) == {"checkpoint", "ft-launcher", "inprocess", "supervisor"}


def test_the_ci_pin_is_a_tested_version() -> None:
    text = (_ROOT / "constraints.txt").read_text(encoding="utf-8")
    pin = re.search(r"^torch==(\d+)\.(\d+)", text, re.MULTILINE)
    assert pin is not None
    assert (int(pin.group(1)), int(pin.group(2))) in TESTED_TORCH
