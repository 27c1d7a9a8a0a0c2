"""resiliency-straggler installed alone into a fresh environment without torch."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "packages" / "straggler"

pytestmark = pytest.mark.slow

SCRIPT = """
import importlib.util, sys
assert importlib.util.find_spec("torch") is None, "torch is installed in the fresh venv"
from resiliency.straggler import Detector
Detector.initialize(node_name="alone")
for _ in range(3):
    with Detector.detection_section("step"):
        pass
report = Detector.generate_report()
assert report.rank_to_node == {0: "alone"}, report
assert report.section_relative_perf_scores == {"step": {0: 1.0}}, report
assert report.local_section_summaries["step"].count == 3
print("single-rank report ok")
"""


def test_single_rank_report_in_a_fresh_venv_without_torch(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        if os.environ.get("RESILIENCY_CI"):  # set by .ci/run: CI must run this test
            pytest.fail("uv is not installed; CI installs it with the test tools")
        pytest.skip("uv is not installed")
    venv = tmp_path / "venv"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    subprocess.run([uv, "venv", "-q", str(venv)], check=True, env=env, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "-q", "-p", str(python), str(PACKAGE)],
        check=True,
        env=env,
        timeout=300,
    )
    done = subprocess.run(
        [str(python), "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "single-rank report ok" in done.stdout
