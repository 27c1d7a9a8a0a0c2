"""The built package: what the wheel ships, its run path, and how a build without CUPTI fails."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import resiliency.straggler_cupti as pkg

SOURCE = Path(__file__).resolve().parents[2] / "packages" / "straggler-cupti"
INSTALLED = Path(pkg.__file__).parent
needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")


def _native_path(name: str) -> Path:
    spec = importlib.util.find_spec(f"resiliency.straggler_cupti.{name}")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def test_wheel_ships_type_stubs_and_no_namespace_init() -> None:
    for name in ("_aggregation_ext.pyi", "_cupti_ext.pyi", "py.typed"):
        assert (INSTALLED / name).is_file(), name
    assert not (INSTALLED.parent / "__init__.py").exists()  # resiliency stays a PEP 420 namespace


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf is not installed")
def test_run_path_finds_cupti_wheels_and_no_temporary_build_path() -> None:
    out = subprocess.run(
        ["readelf", "-d", str(_native_path("_cupti_ext"))],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    if "libcupti" not in out:
        pytest.skip("stub build: no CUPTI to find")
    (line,) = [ln for ln in out.splitlines() if "RUNPATH" in ln or "RPATH" in ln]
    entries = line.split("[", 1)[1].rstrip("]").split(":")
    assert "$ORIGIN/../../nvidia/cu13/lib" in entries
    for entry in entries:
        assert "build-env" not in entry and not entry.startswith("/tmp/"), entry


def _configure(tmp_path: Path, *defines: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RESILIENCY_CUPTI_STUB"}
    return subprocess.run(
        ["cmake", "-S", str(SOURCE), "-B", str(tmp_path / "build"), *defines],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@needs_cmake
def test_build_without_a_toolkit_says_what_to_install(tmp_path: Path) -> None:
    result = _configure(tmp_path, "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON")
    assert result.returncode != 0
    message = " ".join(result.stderr.split())  # CMake re-wraps long messages
    assert "needs CUPTI" in message
    assert "CUDAToolkit_ROOT" in message
    assert "pip install nvidia-cuda-cupti nvidia-cuda-runtime nvidia-cuda-crt" in message
    assert "RESILIENCY_CUPTI_ROOT" in message
    assert "RESILIENCY_CUPTI_STUB=ON" in message


@needs_cmake
def test_cupti_root_without_cupti_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "not-cupti"
    (empty / "include").mkdir(parents=True)
    result = _configure(tmp_path, f"-DRESILIENCY_CUPTI_ROOT={empty}")
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert f"RESILIENCY_CUPTI_ROOT={empty} does not hold CUPTI" in message
    assert "nvidia-cuda-runtime" in message


@pytest.mark.slow
@needs_cmake
@pytest.mark.skipif(
    importlib.util.find_spec("scikit_build_core") is None
    or importlib.util.find_spec("nanobind") is None,
    reason="the stub build test needs scikit-build-core and nanobind in this environment",
)
def test_stub_build_imports_and_refuses_to_start(tmp_path: Path) -> None:
    # The stub is built the way a user asks for it, with no toolkit visible to CMake.
    build = (
        "from scikit_build_core.build import build_wheel\n"
        f"print(build_wheel({str(tmp_path / 'dist')!r}, config_settings={{\n"
        "    'cmake.define.RESILIENCY_CUPTI_STUB': 'ON',\n"
        "    'cmake.define.CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit': 'ON',\n"
        f"    'build-dir': {str(tmp_path / 'build')!r},\n"
        "}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", build],
        cwd=SOURCE,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    wheel = tmp_path / "dist" / result.stdout.strip().splitlines()[-1]
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    check = (
        "from resiliency.straggler_cupti import CuptiKernelProfiler, CuptiUnavailableError\n"
        "from resiliency.straggler_cupti import _cupti_ext\n"
        "assert _cupti_ext.BACKEND == 'stub', _cupti_ext.BACKEND\n"
        "try:\n"
        "    CuptiKernelProfiler().start()\n"
        "except CuptiUnavailableError as exc:\n"
        "    print('REFUSED:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        },
        check=True,
    )
    assert "REFUSED:" in out.stdout
    assert "built as a stub" in out.stdout
