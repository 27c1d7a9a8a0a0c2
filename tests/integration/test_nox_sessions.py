"""Every test file runs in exactly one default nox session, unless the noxfile declares why not.

The noxfile is read, not run (running it would create environments): each default session's
``pytest`` paths are taken from its ``_pytest(session, ...)`` or ``session.run("pytest", ...)``
call, with the module-level tuples they name. A file that two sessions run is allowed only where
the second session is one of ``SECOND_RUNS`` and the noxfile lists the file, by name, in that
session's tuple (the noxfile's comment beside the tuple says what the second run covers).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# session -> the noxfile tuple of files it runs a second time on purpose:
#   integration:    the pure-Python packages' files whose cases need an optional dependency
#                   (torch, matplotlib, ft-core, the launcher); they skip in their own session;
#   ptl_standalone: the callback tests again under the standalone ``pytorch_lightning`` import path.
SECOND_RUNS = {
    "integration": "OPTIONAL_DEPENDENCY_TESTS",
    "ptl_standalone": "PTL_STANDALONE_TESTS",
}
# The default session that runs other sessions, two lanes at once, and the tuple naming them.
SUITE = "suite"
SUITE_LANES = "SUITE_LANES"


class NoxfileShapeError(ValueError):
    """The noxfile holds a form this reader does not understand: say where, never guess."""


def _where(node: ast.AST) -> str:
    return f"noxfile.py line {getattr(node, 'lineno', '?')}"


def _strings(node: ast.expr, consts: dict[str, list[str]]) -> list[str] | None:
    """The strings ``node`` stands for; None for ``session.posargs`` (the user's own)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        out: list[str] = []
        for elt in node.elts:
            out += _strings(elt, consts) or []
        return out
    if isinstance(node, ast.Starred):
        return _strings(node.value, consts)
    if isinstance(node, ast.Attribute) and node.attr == "posargs":
        return None
    if (
        isinstance(node, ast.GeneratorExp)
        and len(node.generators) == 1
        and isinstance(node.generators[0].target, ast.Name)
        and isinstance(node.elt, ast.JoinedStr)
    ):
        # (f"--ignore={t}" for t in NAME)
        name, values = node.generators[0].target.id, _strings(node.generators[0].iter, consts)
        out = []
        for value in values or []:
            text = ""
            for part in node.elt.values:
                if isinstance(part, ast.Constant):
                    text += str(part.value)
                elif (
                    isinstance(part, ast.FormattedValue)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == name
                ):
                    text += value
                else:
                    raise NoxfileShapeError(f"{_where(node)}: unsupported f-string part")
            out.append(text)
        return out
    raise NoxfileShapeError(f"{_where(node)}: cannot read {ast.dump(node)[:80]}")


def _pytest_args(fn: ast.FunctionDef, consts: dict[str, list[str]]) -> list[str] | None:
    """The arguments of the session's pytest call, or None if it runs no pytest."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        helper = isinstance(func, ast.Name) and func.id == "_pytest"
        run = (
            isinstance(func, ast.Attribute)
            and func.attr == "run"
            and bool(node.args)
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "pytest"
        )
        if not (helper or run):
            continue
        args: list[str] = []
        for arg in node.args[1:]:
            args += _strings(arg, consts) or []
        return args
    return None


def read_noxfile(source: str) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """Return the default sessions, each test session's pytest arguments, and the constants."""
    tree = ast.parse(source)
    consts: dict[str, list[str]] = {}
    defaults: list[str] = []
    sessions: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    value = _strings(node.value, consts)
                except NoxfileShapeError:
                    continue  # not a list of strings (a Path, a dict): no test paths in it
                if value is not None:
                    consts[target.id] = value
            elif ast.unparse(target) == "nox.options.sessions":
                defaults = _strings(node.value, consts) or []
        elif isinstance(node, ast.FunctionDef) and any(
            ast.unparse(d).startswith("nox.session") for d in node.decorator_list
        ):
            args = _pytest_args(node, consts)
            if args is not None:
                sessions[node.name] = args
    if not defaults:
        raise NoxfileShapeError("noxfile.py: no `nox.options.sessions = [...]` found")
    if SUITE in defaults:
        # `suite` runs the sessions of its lanes (tools/nox_lanes.py): those are the defaults.
        if SUITE_LANES not in consts:
            raise NoxfileShapeError(
                f"noxfile.py: `{SUITE}` is a default but {SUITE_LANES} is missing"
            )
        defaults = [d for d in defaults if d != SUITE] + consts[SUITE_LANES]
    return defaults, sessions, consts


def _files(args: Iterable[str], root: Path) -> set[str]:
    """The test files a pytest argument list collects (folders expanded, --ignore applied)."""
    chosen: set[str] = set()
    ignored: set[str] = set()
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg.startswith("--ignore="):
            ignored.add(arg.removeprefix("--ignore="))
        elif arg in ("-k", "-m", "-p"):
            skip_next = True
        elif not arg.startswith("-"):
            path = arg.split("::", 1)[0]
            if (root / path).is_dir():
                chosen |= {str(p.relative_to(root)) for p in (root / path).rglob("test_*.py")}
            else:
                chosen.add(path)
    return chosen - ignored


def check(source: str, root: Path) -> list[str]:
    """Every problem found: a test file run by no default session, or twice without reason."""
    defaults, sessions, consts = read_noxfile(source)
    runs: dict[str, set[str]] = {}
    for name in defaults:
        # "ft_core-3.10" is one Python version of the session `ft_core`: a run on another
        # version is not a second run
        session = re.sub(r"-\d+\.\d+$", "", name)
        for path in _files(sessions.get(session, []), root):
            runs.setdefault(path, set()).add(session)
    declared = {
        session: _files(consts.get(tuple_name, []), root)
        for session, tuple_name in SECOND_RUNS.items()
    }
    problems = []
    for path in sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")):
        where = runs.get(path, set())
        if not where:
            problems.append(f"{path}: no default nox session runs it")
            continue
        undeclared = {s for s in where if path not in declared.get(s, set())}
        if len(where) > 1 and len(undeclared) != 1:
            problems.append(
                f"{path}: run by {sorted(where)}; a second run must be declared in one of "
                f"{sorted(SECOND_RUNS.items())} with what it covers"
            )
    for path in sorted(p for p in runs if not (root / p).is_file()):
        problems.append(f"{path}: named in noxfile.py but no such file")
    return problems


def test_every_test_file_runs_in_exactly_one_default_session() -> None:
    problems = check((ROOT / "noxfile.py").read_text(), ROOT)
    assert not problems, "\n".join(problems)


def test_the_reader_sees_the_sessions_it_is_meant_to_check() -> None:
    defaults, sessions, consts = read_noxfile((ROOT / "noxfile.py").read_text())
    for session, tuple_name in SECOND_RUNS.items():
        assert session in defaults and session in sessions, session
        assert consts.get(tuple_name), f"noxfile.py has no tuple {tuple_name} for {session}"
    assert {"checkpoint", "integration", "ft_launcher", "ptl"} <= set(sessions)


SYNTHETIC = """
import nox
SUITE_LANES = (("a",), ("b",))
nox.options.sessions = ["a", "b", "extra"]
TWICE = ("tests/a/test_one.py",)
OPTIONAL_DEPENDENCY_TESTS = ("tests/a/test_two.py",)

@nox.session(python="3.11")
def a(session):
    _pytest(session, "tests/a", *(f"--ignore={t}" for t in IGNORED), *session.posargs)

@nox.session(python="3.11")
def b(session):
    session.run("pytest", *TWICE, "-k", "not slow")

@nox.session(python="3.11")
def integration(session):
    _pytest(session, *OPTIONAL_DEPENDENCY_TESTS)

@nox.session(python="3.11")
def extra(session):
    session.run("ruff", "check")
"""


@pytest.mark.parametrize(
    ("ignored", "defaults", "expected"),
    [
        # test_one.py runs in a and in b, and b declares nothing: refused.
        ((), '"a", "b"', ["tests/a/test_one.py: run by ['a', 'b']"]),
        # ignored by a: b alone runs it; test_three.py then runs nowhere.
        (
            ("tests/a/test_one.py", "tests/a/test_three.py"),
            '"a", "b"',
            ["tests/a/test_three.py: no default nox session runs it"],
        ),
        # integration declares test_two.py: a second run with a reason is fine.
        (("tests/a/test_one.py",), '"a", "b", "integration"', []),
        # `suite` stands for its lanes' sessions: a and b, so test_one.py runs twice.
        ((), '"suite"', ["tests/a/test_one.py: run by ['a', 'b']"]),
        # two Python versions of one session are one session, not a second run ...
        ((), '"a-3.10", "a-3.13"', []),
        # ... but a version of a and b still run test_one.py twice
        ((), '"a-3.10", "b"', ["tests/a/test_one.py: run by ['a', 'b']"]),
    ],
)
def test_the_check_names_a_file_run_twice_or_never(
    tmp_path: Path, ignored: tuple[str, ...], defaults: str, expected: list[str]
) -> None:
    for name in ("test_one.py", "test_two.py", "test_three.py"):
        (tmp_path / "tests" / "a").mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / "a" / name).write_text("")
    source = SYNTHETIC.replace('"a", "b", "extra"', defaults + ', "extra"').replace(
        "IGNORED = ()", ""
    )
    source = f"IGNORED = {ignored!r}\n" + source
    problems = check(source, tmp_path)
    assert [p.split(";")[0] for p in problems] == expected, problems


def test_a_suite_without_its_lanes_is_an_error() -> None:
    source = 'import nox\nnox.options.sessions = ["suite"]\n'
    with pytest.raises(NoxfileShapeError, match="SUITE_LANES is missing"):
        read_noxfile(source)


def test_a_form_the_reader_does_not_know_is_an_error_naming_the_line() -> None:
    source = 'import nox\nnox.options.sessions = ["a"]\n\n@nox.session\ndef a(session):\n'
    source += "    _pytest(session, paths_from_somewhere())\n"
    with pytest.raises(NoxfileShapeError, match=r"noxfile.py line 6: cannot read"):
        read_noxfile(source)
