"""Every way to test, lint, build, benchmark and demo the resiliency monorepo.

Each session names only the packages it tests; their sibling dependencies come from this checkout
by themselves (a uv workspace: the root ``pyproject.toml`` and each package's
``[tool.uv.sources]``), so a new dependency between packages never needs a noxfile change. Each
per-package session installs only that package and what it declares into a fresh environment, which
proves the wheel stands alone. Torch is pinned through ``constraints.txt`` so no session ever pulls
a CUDA build on a CPU machine.

    nox                 # the test suite (what CI runs): the `suite` session, two lanes at once
    nox -s ptl          # one session (`nox -s ptl -- -k NAME`: some of its tests)
    nox -s demo         # the whole toolkit against torchrun, under the same faults (~2 min)
    nox -s bench        # speed measurements
    nox -l              # every session
"""

from __future__ import annotations

import configparser
import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ROOT / "constraints.txt"
PACKAGES = ROOT / "packages"
ALL_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
TORCH_PYTHON = "3.11"  # the local CPU torch wheel exists for 3.11 only
CHECKPOINT_LAUNCHER_TESTS = (
    "tests/checkpoint/test_emergency_launcher.py",
    "tests/checkpoint/test_tiers_launcher.py",
    "tests/checkpoint/test_readonly_root_launcher.py",
)
TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "hypothesis>=6.100"]
# Most tests wait on other processes (monitors, launchers, rendezvous and heartbeat deadlines)
# rather than compute, so pytest-xdist runs several at once even on a 2-core machine. Measured on
# one (issue 31): ft_core 100 s -> 43 s; integration 865 s -> 588 s, where it becomes CPU-bound
# (1135 s of CPU: every rank imports torch). Tests that must not overlap share an
# `xdist_group` marker (`--dist loadgroup` runs each group on one worker).
TEST_WORKERS = 4
# Object-store checkpoint tests: s3fs against moto's S3 server on loopback.
S3_TEST_DEPS = ["s3fs>=2023.1", "moto[server]>=5"]
# What `_warm` imports for sessions whose tests start launchers (ft-launcher's agent is torch's
# elastic agent, imported through torch.distributed.run) or everything.
LAUNCHER_MODULES = ("resiliency.launcher", "torch.distributed.run")
EVERYTHING_MODULES = (
    "resiliency.ptl",
    "resiliency.inprocess",
    "resiliency.supervisor",
    "resiliency.simulator",
    "matplotlib.pyplot",
    *LAUNCHER_MODULES,
)


nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = False
# What `nox` runs: the `suite` session, which runs these sessions in two lanes at once
# (tools/nox_lanes.py), each lane in its order, a lane that is done taking the other's next one.
# nox alone runs sessions one after the other, and on a 2-core machine the multi-process
# sessions keep ~1.9 cores busy while the others leave most of a core idle (measured on a clean
# clone, issue 31: ft_core 1.1, simulator 1.26, ptl 1.45, ptl_standalone 1.26, demo 0.8). Lane 0
# holds the CPU-bound multi-process sessions, longest first; lane 1 the others, quick feedback
# (lint, typecheck) first and the shortest last, so that the two lanes end close together (a
# clean-clone run that ended with supervisor, 130 s, left the other lane idle for 65 s).
# A name stands for each of its Python versions.
# The torch-free packages (ft_core, goodput, straggler) run on the oldest and the newest Python
# they support here; `nox -s ft_core` runs all four. The versions between add nothing the two
# ends do not cover (a syntax or stdlib change shows at one end; a removal stays removed), and
# 3.11's is run by every torch session, which imports and drives these packages: four versions
# cost 4 x 52 s of CPU for ft_core alone, measured on this machine (issue 31).
SUITE_LANES = (
    ("integration", "checkpoint", "ft_launcher", "inprocess"),
    (
        "lint",
        "typecheck",
        "ptl",
        "simulator",
        "supervisor",
        "ptl_standalone",
        "ft_core-3.10",
        "ft_core-3.13",
        "straggler_cupti",
        "build",
        "goodput-3.10",
        "goodput-3.13",
        "straggler-3.10",
        "straggler-3.13",
    ),
)
nox.options.sessions = ["suite"]
# Sessions that run no tests carry this tag: CI resolves and installs each of them
# (`nox --install-only -t install-in-ci`), so a broken install is found before a user finds it.
# `demo` is not tagged: CI runs it in full (the README's first command).
INSTALL_IN_CI = ["install-in-ci"]


def _pip_find_links() -> str | None:
    """Return pip's configured find-links so uv sees the same local wheels pip does."""
    if os.environ.get("PIP_FIND_LINKS"):
        return os.environ["PIP_FIND_LINKS"]
    for cfg in (Path("/etc/pip.conf"), Path.home() / ".config/pip/pip.conf"):
        parser = configparser.ConfigParser()
        if cfg.is_file():
            parser.read(cfg)
            if parser.has_option("global", "find-links"):
                return parser.get("global", "find-links")
    return None


def _configure_environment() -> None:
    """Make uv behave like this machine's pip, and make pyenv's interpreters visible."""
    find_links = _pip_find_links()
    if find_links:
        os.environ.setdefault("UV_FIND_LINKS", find_links)
    os.environ.setdefault("UV_CONSTRAINT", str(CONSTRAINTS))
    # Bytecode is written on first import, not compiled at install: compiling every module of
    # torch and Lightning cost ~36 s of CPU per environment (20 environments in CI), most of it
    # for modules nothing imports, and nothing at all in sessions that only install or type-check.
    # These machines set PYTHONDONTWRITEBYTECODE=1, which would make every process compile its
    # imports again (`import torch, lightning`: 19 s of CPU instead of 6): "0" lets the sessions'
    # processes write it. See `_warm`.
    os.environ.setdefault("UV_COMPILE_BYTECODE", "0")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "0"
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    # uv installs workspace siblings as editable by default; sessions take built wheels, so a
    # file missing from a sibling's wheel fails here, as it would for a user.
    os.environ.setdefault("UV_NO_EDITABLE", "1")
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    if shutil.which("pyenv") and (pyenv_root / "versions").is_dir():
        # pyenv's shims set PYENV_VERSION to the one running interpreter; extend it (never narrow
        # it) so the other Python versions the pure-Python sessions test on are visible too.
        current = [v for v in os.environ.get("PYENV_VERSION", "").split(":") if v]
        versions = sorted(p.name for p in (pyenv_root / "versions").iterdir() if p.is_dir())
        for minor in ALL_PYTHONS:
            matches = [v for v in versions if v.startswith(minor + ".")]
            if matches and not any(v.startswith(minor + ".") for v in current):
                current.append(matches[-1])
        os.environ["PYENV_VERSION"] = ":".join(current)


_configure_environment()


def _install(session: nox.Session, *requirements: str) -> None:
    """Install requirements; ``pkg:NAME[extras]`` is the package in ``packages/NAME``.

    Only the packages a session tests are named: uv takes their siblings from the workspace.
    """
    args = [_pkg(r.removeprefix("pkg:")) if r.startswith("pkg:") else r for r in requirements]
    session.install("-c", str(CONSTRAINTS), *args)


def _pytest(
    session: nox.Session, *args: str, workers: int = TEST_WORKERS, env: dict[str, str] | None = None
) -> None:
    """Run pytest on ``workers`` processes (0: in this one); no test collected fails (exit 5).

    ``nox -s NAME -- -n 0`` runs one session's tests in one process (the last ``-n`` wins).
    """
    session.run(
        "pytest",
        *("--numprocesses", str(workers), "--dist", "loadgroup"),
        *args,
        *session.posargs,
        env=env,
    )


def _warm(session: nox.Session, *modules: str) -> None:
    """Import the session's heavy modules once, so their bytecode is written before the tests.

    Without it the first processes of a run (pytest-xdist's workers, a job's ranks) all start at
    once and each compiles the same modules (torch: ~3 s of CPU each, Lightning: ~13 s).
    """
    session.run("python", "-c", f"import {', '.join(modules)}")


def _pkg(spec: str) -> str:
    """``NAME[extras]`` -> the path of ``packages/NAME`` with the extras."""
    name, bracket, extras = spec.partition("[")
    path = PACKAGES / name
    if not (path / "pyproject.toml").is_file():
        raise ValueError(f"noxfile: no package at {path}")
    return f"{path}{bracket}{extras}"


@nox.session(python=ALL_PYTHONS)
def ft_core(session: nox.Session) -> None:
    """resiliency-ft-core alone (pydantic + pyyaml, no torch)."""
    _install(session, "pkg:ft-core", *TEST_DEPS)
    _warm(session, "resiliency.ft")
    # Its tests wait on monitors' deadlines and use little CPU (1.1 of 2 cores at 4 workers):
    # measured on a fresh 3.11 session, 4 workers 24.5 s, 8 workers 19.5 s, 12 20.0 s, 16 23.1 s.
    _pytest(session, "tests/ft_core", "tests/compat/test_ft_core.py", workers=8)


@nox.session(python=ALL_PYTHONS)
def straggler(session: nox.Session) -> None:
    """resiliency-straggler alone: no torch, no CUDA, no siblings."""
    _install(session, "pkg:straggler", *TEST_DEPS)
    # ~10 s in one process: starting xdist's workers would cost more than they save.
    _pytest(session, "tests/straggler", "tests/compat/test_straggler.py", workers=0)


@nox.session(python=ALL_PYTHONS)
def goodput(session: nox.Session) -> None:
    """resiliency-goodput alone: stdlib only (the plot extra is tested in ``integration``)."""
    _install(session, "pkg:goodput", *TEST_DEPS)
    _warm(session, "resiliency.goodput")
    _pytest(session, "tests/goodput", workers=2)


@nox.session(python=TORCH_PYTHON)
def checkpoint(session: nox.Session) -> None:
    """resiliency-checkpoint with its dependencies (goodput, torch)."""
    _install(session, "pkg:checkpoint[remote]", *S3_TEST_DEPS, *TEST_DEPS)
    _warm(session, "resiliency.checkpoint", "s3fs", "moto.server")
    # The trials under two ft-launchers need the launcher: they run in `integration`.
    _pytest(session, "tests/checkpoint", *(f"--ignore={t}" for t in CHECKPOINT_LAUNCHER_TESTS))


@nox.session(python=TORCH_PYTHON)
def simulator(session: nox.Session) -> None:
    """resiliency-simulator, with the launcher and checkpoint package its fault matrix drives."""
    _install(session, "pkg:simulator", "pkg:ft-launcher", "pkg:checkpoint", *TEST_DEPS)
    _warm(session, "resiliency.simulator", "resiliency.checkpoint", *LAUNCHER_MODULES)
    _pytest(session, "tests/simulator")


@nox.session(python=TORCH_PYTHON)
def supervisor(session: nox.Session) -> None:
    """resiliency-supervisor with the launcher it drives; etcd tests need the `etcd` binary."""
    _install(session, "pkg:supervisor[etcd]", "pkg:ft-launcher", *TEST_DEPS)
    _warm(session, "resiliency.supervisor", *LAUNCHER_MODULES)
    _pytest(session, "tests/supervisor")


@nox.session(python=TORCH_PYTHON)
def inprocess(session: nox.Session) -> None:
    """resiliency-inprocess (torch): in-process restarts of 4 gloo ranks under torchrun and under
    ft-launcher.

    ft-launcher is a test dependency only. Tests whose subject is not the launcher (healing, the
    repeated-fault rule, the unbroken reference) fork their ranks from its pre-imported server:
    measured here, 9 s of CPU per 4-rank job instead of 20 s for torchrun's four fresh
    interpreters (issue 31). That the package never imports the launcher is checked from its source
    (tests/integration/test_sibling_interfaces.py), not by leaving it out of this environment.
    """
    _install(session, "pkg:inprocess", "pkg:ft-launcher", *TEST_DEPS)
    _warm(
        session,
        "resiliency.inprocess",
        "torch.distributed.fsdp",
        "torch._dynamo",
        *LAUNCHER_MODULES,
    )
    _pytest(session, "tests/inprocess")


@nox.session(python=TORCH_PYTHON)
def straggler_cupti(session: nox.Session) -> None:
    """Build the CUPTI extension wheel and run its GPU-free tests (GPU tests skip without one)."""
    # nanobind and scikit-build-core let the tests build the stub variant of the wheel too.
    _install(
        session,
        "pkg:straggler-cupti",
        "nanobind>=2",
        "scikit-build-core>=0.10",
        *TEST_DEPS,
    )
    _pytest(session, "tests/straggler_cupti", workers=0)  # ~30 s, mostly one wheel build


@nox.session(python=TORCH_PYTHON)
def ft_launcher(session: nox.Session) -> None:
    """resiliency-ft-launcher with its dependencies (ft-core, goodput, torch)."""
    _install(session, "pkg:ft-launcher", *TEST_DEPS)
    _warm(session, *LAUNCHER_MODULES)
    _pytest(session, "tests/ft_launcher", "tests/compat/test_ft_launcher.py")


# resiliency-ptl (its dependencies come with it), and ft-launcher for the end-to-end tests.
PTL_PACKAGES = ("pkg:ptl-resiliency", "pkg:ft-launcher")


@nox.session(python=TORCH_PYTHON)
def ptl(session: nox.Session) -> None:
    """resiliency-ptl with its dependencies (ft-core, straggler, checkpoint, goodput, lightning)."""
    _install(session, *PTL_PACKAGES, *S3_TEST_DEPS, *TEST_DEPS)
    _warm(session, "resiliency.ptl", "s3fs", "moto.server", *LAUNCHER_MODULES)
    _pytest(session, "tests/ptl_resiliency", "tests/compat/test_ptl.py")


# One test file per callback family, run under the standalone package's Trainer. Left to `ptl`:
# the timeout calculations ("persisted"), the ft-launcher loop over the unmodified example, the
# second emergency-save victim and the object-store resume (S3 test deps are installed there),
# none of which depends on Lightning's import path.
PTL_STANDALONE_TESTS = (
    "tests/ptl_resiliency/test_without_launcher.py",
    "tests/ptl_resiliency/test_callback_args.py",
    "tests/ptl_resiliency/test_straggler_ddp.py",
    "tests/ptl_resiliency/test_ft_callback.py",
    "tests/ptl_resiliency/test_sections_callback.py",
    "tests/ptl_resiliency/test_local_checkpoint_callback.py",
    "tests/ptl_resiliency/test_checkpoint_callbacks.py"
    "::test_sigterm_to_one_ddp_rank_saves_an_agreed_step_and_resumes[1]",
)


@nox.session(python=TORCH_PYTHON)
def ptl_standalone(session: nox.Session) -> None:
    """The Lightning callbacks under the standalone ``pytorch_lightning`` package's Trainer.

    The same installs as ``ptl`` plus ``pytorch-lightning`` (pinned beside ``lightning`` in
    constraints.txt); ``RESILIENCY_TEST_LIGHTNING=pytorch_lightning`` makes the tests, their job
    scripts and the example they load train through ``pytorch_lightning`` instead of
    ``lightning.pytorch`` (tests/ptl_resiliency/lightning_flavour.py). About a minute: the jobs
    fork from a zygote that imported the flavour once (tests/ptl_resiliency/job_zygote.py).
    """
    _install(session, *PTL_PACKAGES, "pytorch-lightning", *TEST_DEPS)
    _warm(session, "resiliency.ptl", "pytorch_lightning", *LAUNCHER_MODULES)
    _pytest(
        session,
        *PTL_STANDALONE_TESTS,
        *("-k", "not persisted and not object_store"),
        env={"RESILIENCY_TEST_LIGHTNING": "pytorch_lightning"},
    )


# Every pure-Python package (straggler-cupti, the one compiled package, has its own session).
ALL_PACKAGES = (
    "pkg:ft-launcher[supervisor]",
    "pkg:supervisor[etcd]",
    "pkg:ptl-resiliency",
    "pkg:simulator",
    "pkg:checkpoint",
    "pkg:goodput[plot]",
    "pkg:inprocess",
)


def _install_everything(session: nox.Session) -> None:
    _install(session, *ALL_PACKAGES, *TEST_DEPS)


# Files of the pure-Python packages' tests with cases that need what those packages' own sessions
# leave out on purpose (torch, matplotlib, ft-core beside straggler, ft-launcher): they skip
# there and run in `integration`. The rest of those folders runs once per Python version in its
# own session only. A new test file that needs an optional dependency belongs in this list.
# tests/integration/test_nox_sessions.py checks that every test file runs in exactly one default
# session, or a second time only from this list or PTL_STANDALONE_TESTS.
OPTIONAL_DEPENDENCY_TESTS = (
    "tests/straggler/test_cuda_events_gpu.py",  # torch (and a GPU)
    "tests/straggler/test_exchange_device.py",  # ft-core
    "tests/straggler/test_gloo.py",  # torch
    "tests/straggler/test_collective_wait.py",  # torch (DDP)
    "tests/straggler/test_history_heatmap.py",  # matplotlib
    "tests/compat/test_straggler.py",  # torch
    "tests/ft_core/test_cli_args.py",  # torch.distributed.run
    "tests/ft_core/test_distributed_timeouts.py",  # torch
    "tests/goodput/test_cli.py",  # matplotlib
    "tests/goodput/test_report_usability.py",  # matplotlib
    *CHECKPOINT_LAUNCHER_TESTS,  # two ft-launchers
)


@nox.session(python=TORCH_PYTHON)
def integration(session: nox.Session) -> None:
    """Everything installed: cross-package, multi-process and torch-dependent tests."""
    _install_everything(session)
    _warm(session, *EVERYTHING_MODULES)
    _pytest(session, "tests/integration", "tests/docs", *OPTIONAL_DEPENDENCY_TESTS)


@nox.session(python=False)
def suite(session: nox.Session) -> None:
    """Every test session (SUITE_LANES), two at a time; each one's log printed whole at its end."""
    session.run(
        sys.executable,
        "tools/nox_lanes.py",
        *(f"--lane={','.join(lane)}" for lane in SUITE_LANES),
        *(["--", *session.posargs] if session.posargs else []),
        external=True,
    )


@nox.session(python=TORCH_PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    _install(session, "ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=TORCH_PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy over the public modules of every pure-Python package."""
    _install(session, *ALL_PACKAGES, "mypy>=1.10", "types-PyYAML")
    session.run(
        "mypy",
        *("-p", "resiliency.ft"),
        *("-p", "resiliency.straggler"),
        *("-p", "resiliency.launcher"),
        *("-p", "resiliency.ptl"),
        *("-p", "resiliency.goodput"),
        *("-p", "resiliency.checkpoint"),
        *("-p", "resiliency.simulator"),
        *("-p", "resiliency.supervisor"),
        *("-p", "resiliency.inprocess"),
    )


@nox.session(python=TORCH_PYTHON)
def build(session: nox.Session) -> None:
    """Build every wheel into dist/, without workspace sources: each builds from its own folder."""
    session.run(
        "uv",
        "build",
        "--all-packages",
        "--no-sources",
        "--wheel",
        "--out-dir",
        "dist",
        external=True,
    )


@nox.session(python=TORCH_PYTHON)
def demo(session: nox.Session) -> None:
    """The whole toolkit against torchrun: the same hang, crash and preemption; goodput of both."""
    _install(session, "pkg:ptl-resiliency", "pkg:ft-launcher", "pkg:simulator", "pkg:goodput[plot]")
    _warm(session, "resiliency.ptl", "resiliency.simulator", "matplotlib.pyplot", *LAUNCHER_MODULES)
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session(python=TORCH_PYTHON, tags=INSTALL_IN_CI)
def demo_hang(session: nox.Session) -> None:
    """ft-launcher runs DDP training; a rank hangs; the group restarts and finishes."""
    _install(session, "pkg:ft-launcher")
    _warm(session, *LAUNCHER_MODULES)
    session.run("python", "examples/demo_launcher.py", *session.posargs)


@nox.session(python=TORCH_PYTHON, tags=INSTALL_IN_CI)
def demo_monitor(session: nox.Session) -> None:
    """One rank and its monitor, no launcher: the rank hangs, is stack-dumped and killed."""
    _install(session, "pkg:ft-core")
    session.run("python", "examples/demo_hang.py", *session.posargs)


@nox.session(python=TORCH_PYTHON, tags=INSTALL_IN_CI)
def bench(session: nox.Session) -> None:
    """Speed and overhead measurements; prints one table and writes benchmarks/results/."""
    _install_everything(session)
    _warm(session, *EVERYTHING_MODULES)
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session(python=TORCH_PYTHON, tags=INSTALL_IN_CI)
def bench_goodput(session: nox.Session) -> None:
    """The goodput benchmark: torchrun + Lightning, ft-launcher + the toolkit, and in-process
    restart (a plain-loop twin of the job), under the same faults."""
    _install_everything(session)
    _warm(session, *EVERYTHING_MODULES)
    session.run("python", "benchmarks/bench_goodput.py", *session.posargs)
