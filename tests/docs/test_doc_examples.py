"""Run every code example of the READMEs and docs, so none can rot.

Every fenced block in README.md, packages/*/README.md and docs/*.md must name its language. A
python, bash, sh, shell or console block must carry a marker: an HTML comment on the line right
before its opening fence (invisible on GitHub and in rendered docs):

``<!-- test: run -->``
    python block, run as a script (``python example.py``) in a fresh temporary directory.
``<!-- test: launcher ARGS -->``
    python block, saved as ``train.py`` and run as ``python -m resiliency.launcher ARGS train.py``.
``<!-- test: shell -->``
    bash/sh block, run with ``bash -euo pipefail`` (``python`` and ``ft-launcher`` on PATH are the
    ones of the interpreter running the tests).
``<!-- test: file NAME -->``
    any block, not run: saved as NAME in the directory of every later block of the same page.
``<!-- test: install -->``
    ``uv pip install ./packages/NAME[extras]`` lines: every package they name must be one of this
    repository's, with the extras it declares (nothing is downloaded).
``<!-- test: ci -->``
    bash block of the README's own commands: ``.ci/run`` runs each line as written on a clean
    clone (``.ci/readme_commands.py`` reads them); not run here.
``<!-- test: ft-config -->``
    yaml block: must load with ``FaultToleranceConfig.from_yaml_file``.
``<!-- test: skip (reason) -->``
    not run; the reason is required (e.g. needs a GPU or several nodes).

``run``, ``launcher`` and ``shell`` take options after the kind: ``expect-exit=N`` (default 0) and
``output``: the next fenced block (``text``) is the expected output; each of its non-empty lines
must appear in the example's stdout or stderr, where ``...`` matches anything.

Optional dependencies (torch, lightning, the launcher, the CUPTI plug-in, matplotlib) are
``pytest.importorskip``-ed per block (a python block's top-level imports; ``ft-launcher`` in a
shell block), so a partial environment skips what it cannot run.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md", *REPO.glob("packages/*/README.md"), *REPO.glob("docs/*.md")],
    key=lambda p: str(p.relative_to(REPO)),
)
RUNNABLE_LANGS = {"python", "py", "bash", "sh", "shell", "console"}
PYTHON_LANGS = {"python", "py"}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
KINDS = {"run", "launcher", "shell", "file", "install", "ft-config", "skip", "ci"}
BLOCK_TIMEOUT_S = 90.0
# Modules an example may need that are optional in some test environments.
OPTIONAL_MODULES = (
    "torch",
    "lightning",
    "pytorch_lightning",
    "matplotlib",
    "resiliency.launcher",
    "resiliency.ptl",
    "resiliency.straggler_cupti",
)
_MARKER = re.compile(r"^\s*<!--\s*test:\s*(?P<body>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[^\s`]*)")


@dataclass
class Block:
    """One fenced code block and its marker."""

    page: Path
    line: int
    lang: str
    code: str
    kind: str | None = None
    args: str = ""
    options: dict[str, str] = field(default_factory=dict)
    expected_output: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _parse_marker(body: str) -> tuple[str, str, dict[str, str]]:
    """Split ``kind [options] [args]`` of a marker; ``skip`` keeps its reason as args."""
    kind, _, rest = body.partition(" ")
    rest = rest.strip()
    if kind in ("skip", "file"):
        return kind, rest, {}
    options: dict[str, str] = {}
    words = shlex.split(rest)
    args = []
    for word in words:
        if word == "output":
            options["output"] = ""
        elif word.startswith("expect-exit="):
            options["expect-exit"] = word.split("=", 1)[1]
        else:
            args.append(word)
    return kind, shlex.join(args), options


def parse_page(page: Path) -> tuple[list[Block], list[str]]:
    """Return the page's fenced blocks and the problems found in its markers and fences."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    pending: tuple[int, str] | None = None  # (line, marker body)
    i = 0
    while i < len(lines):
        text = lines[i]
        marker = _MARKER.match(text)
        fence = _FENCE.match(text)
        if marker:
            if pending is not None:
                problems.append(f"{page.name}:{pending[0]}: marker not followed by a code block")
            pending = (i + 1, marker.group("body"))
            i += 1
            continue
        if not fence:
            if pending is not None:
                problems.append(
                    f"{page.name}:{pending[0]}: the marker must be on the line right before "
                    "the opening fence"
                )
                pending = None
            i += 1
            continue
        indent, fence_chars, lang = fence.group("indent", "fence", "lang")
        start = i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence_chars):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        if i >= len(lines):
            problems.append(f"{page.name}:{start}: code block is never closed")
        i += 1
        block = Block(page, start, lang.lower(), "\n".join(body) + "\n")
        if pending is not None:
            block.kind, block.args, block.options = _parse_marker(pending[1])
            pending = None
        blocks.append(block)
    if pending is not None:
        problems.append(f"{page.name}:{pending[0]}: marker not followed by a code block")
    # An `output` block is the expected output of the runnable block before it.
    for prev, nxt in itertools.pairwise(blocks):
        if prev.kind in ("run", "launcher", "shell") and "output" in prev.options:
            prev.expected_output = nxt.code
    return blocks, problems


def _problems_of(block: Block) -> list[str]:
    where = block.id
    if not block.lang:
        return [f"{where}: a code block must name its language (```python, ```bash, ```text...)"]
    if block.kind is None:
        if block.lang in RUNNABLE_LANGS:
            return [
                f"{where}: {block.lang} block without a test marker; put e.g. "
                "`<!-- test: run -->` or `<!-- test: skip (reason) -->` on the line before it"
            ]
        return []
    problems = []
    if block.kind not in KINDS:
        problems.append(f"{where}: unknown marker kind {block.kind!r}; use one of {sorted(KINDS)}")
    elif block.kind == "skip" and not re.fullmatch(r"\(.+\)", block.args):
        problems.append(f"{where}: `skip` needs a reason in parentheses: skip (needs a GPU)")
    elif block.kind in ("run", "launcher") and block.lang not in PYTHON_LANGS:
        problems.append(f"{where}: `{block.kind}` is for python blocks, not {block.lang}")
    elif block.kind == "shell" and block.lang not in SHELL_LANGS:
        problems.append(f"{where}: `shell` is for bash/sh blocks, not {block.lang}")
    elif block.kind == "file" and not block.args:
        problems.append(f"{where}: `file` needs a file name")
    elif block.kind == "ft-config" and block.lang != "yaml":
        problems.append(f"{where}: `ft-config` is for yaml blocks")
    elif "output" in block.options and block.expected_output is None:
        problems.append(f"{where}: `output` but no block follows with the expected output")
    return problems


ALL: list[Block] = []
PARSE_PROBLEMS: list[str] = []
for _page in PAGES:
    _blocks, _problems = parse_page(_page)
    ALL.extend(_blocks)
    PARSE_PROBLEMS.extend(_problems)
EXECUTED = [b for b in ALL if b.kind in ("run", "launcher", "shell", "install", "ft-config")]


def test_every_runnable_block_has_a_valid_marker():
    problems = list(PARSE_PROBLEMS)
    for block in ALL:
        problems.extend(_problems_of(block))
    assert not problems, "\n".join(problems)


def test_pages_are_found_and_examples_exist():
    names = {str(p.relative_to(REPO)) for p in PAGES}
    assert "README.md" in names
    assert "docs/troubleshooting.md" in names
    assert len(EXECUTED) >= 10, [b.id for b in EXECUTED]


def test_parser_rejects_unmarked_and_malformed_blocks(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint(1)\n```\n"
        "<!-- test: skip -->\n```bash\nls\n```\n"
        "<!-- test: frobnicate -->\n```python\npass\n```\n"
        "```\nno language\n```\n"
        "<!-- test: run -->\n\n```python\npass\n```\n",
        encoding="utf-8",
    )
    blocks, problems = parse_page(page)
    for block in blocks:
        block.page = REPO / block.page.name  # _problems_of names blocks relative to REPO
        problems.extend(_problems_of(block))
    text = "\n".join(problems)
    assert "python block without a test marker" in text
    assert "`skip` needs a reason" in text
    assert "unknown marker kind 'frobnicate'" in text
    assert "must name its language" in text
    assert "right before the opening fence" in text


def test_output_check_matches_with_wildcards_and_reports_a_changed_message():
    block = Block(
        REPO / "README.md", 1, "python", "", expected_output="rank ... hung: no heartbeat\n"
    )
    _check_output(block, "[ft-monitor] rank 1 (pid 7) hung: no heartbeat for 1.0 s")
    with pytest.raises(AssertionError, match="Missing lines"):
        _check_output(block, "[ft-monitor] rank 1 (pid 7) stalled: no heartbeat for 1.0 s")


def _skip_missing_modules(code: str, lang: str) -> None:
    if lang in PYTHON_LANGS:
        tree = ast.parse(code)
        names = set()
        # Top-level imports only: an import inside a branch is the example's own fallback.
        for node in tree.body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
    else:
        names = {"resiliency.launcher"} if "ft-launcher" in code or "ft_launcher" in code else set()
        names |= {m for m in OPTIONAL_MODULES if re.search(rf"\bimport {re.escape(m)}\b", code)}
    for name in sorted(names):
        for optional in OPTIONAL_MODULES:
            if name == optional or name.startswith(optional + "."):
                pytest.importorskip(optional)


def _env(cwd: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The examples' `python`, `ft-launcher` and console scripts are this interpreter's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(cwd)
    for name in list(env):
        # A test run started by a launcher must not hand its own rank settings to the examples.
        if name.startswith(("FT_", "TORCHELASTIC_", "FAULT_TOL_")) or name in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            del env[name]
    return env


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=_env(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # one process group: a timeout kills workers and monitors too
    )
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"example ran longer than {BLOCK_TIMEOUT_S:.0f} s; output:\n{out[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def _expected_line_pattern(line: str) -> re.Pattern[str]:
    parts = [re.escape(part) for part in line.strip().split("...")]
    return re.compile(".*?".join(parts))


def _check_output(block: Block, output: str) -> None:
    assert block.expected_output is not None
    missing = [
        line
        for line in block.expected_output.splitlines()
        if line.strip() and not _expected_line_pattern(line).search(output)
    ]
    assert not missing, (
        f"{block.id}: the documented output does not match what the example printed.\n"
        f"Missing lines: {missing}\nOutput:\n{output[-4000:]}"
    )


def _write_earlier_files(block: Block, directory: Path) -> None:
    for other in ALL:
        if other.page == block.page and other.line < block.line and other.kind == "file":
            target = directory / other.args
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(other.code, encoding="utf-8")


def _repo_distributions() -> dict[str, tuple[str, set[str]]]:
    """Each distribution of this repository: its folder under packages/ and its extras."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    dists = {}
    for pyproject in REPO.glob("packages/*/pyproject.toml"):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        extras = set(project.get("optional-dependencies", {}))
        dists[project["name"]] = (pyproject.parent.name, extras)
    return dists


_REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9_./-]+?)/?(\[(?P<extras>[^\]]*)\])?")


def _check_install(block: Block) -> None:
    """Each line installs packages of this checkout: `uv pip install ./packages/NAME[extras]`.

    Nothing is published to an index, so `pip install resiliency-...` would fail for a user; the
    workspace sources make uv take the siblings from the checkout too.
    """
    dists = _repo_distributions()
    folders = {folder: extras for folder, extras in dists.values()}
    named = 0
    for line in block.code.splitlines():
        words = shlex.split(line, comments=True)
        if words[:3] != ["uv", "pip", "install"]:
            assert not words, (
                f"{block.id}: an install block holds only `uv pip install ./packages/...` "
                f"lines: {line}"
            )
            continue
        for word in words[3:]:
            if word.startswith("-"):
                continue
            match = _REQUIREMENT.fullmatch(word)
            assert match, f"{block.id}: cannot read the requirement {word!r}"
            path = match.group("name")
            assert path.startswith("./packages/"), (
                f"{block.id}: {word!r} is not a package of this checkout (./packages/NAME); "
                "nothing of this repository is on an index"
            )
            folder = path.removeprefix("./packages/")
            assert folder in folders, f"{block.id}: there is no package ./packages/{folder}"
            for extra in filter(None, (match.group("extras") or "").split(",")):
                assert extra in folders[folder], f"{block.id}: {folder} has no extra {extra!r}"
            named += 1
    assert named, f"{block.id}: no package named"


@pytest.mark.parametrize("block", EXECUTED, ids=[b.id for b in EXECUTED])
def test_doc_example(block: Block, tmp_path: Path):
    if block.kind == "install":
        _check_install(block)
        return
    if block.kind == "ft-config":
        from resiliency.ft import FaultToleranceConfig  # noqa: PLC0415

        path = tmp_path / "ft.yaml"
        path.write_text(block.code, encoding="utf-8")
        FaultToleranceConfig.from_yaml_file(path)
        return
    _skip_missing_modules(block.code, block.lang)
    _write_earlier_files(block, tmp_path)
    if block.kind == "run":
        (tmp_path / "example.py").write_text(block.code, encoding="utf-8")
        argv = [sys.executable, "example.py"]
    elif block.kind == "launcher":
        pytest.importorskip("resiliency.launcher")
        (tmp_path / "train.py").write_text(block.code, encoding="utf-8")
        argv = [sys.executable, "-m", "resiliency.launcher", *shlex.split(block.args), "train.py"]
    else:
        (tmp_path / "example.sh").write_text(block.code, encoding="utf-8")
        argv = ["bash", "-euo", "pipefail", "example.sh"]
    result = _run(argv, tmp_path)
    expected = int(block.options.get("expect-exit", "0"))
    assert result.returncode == expected, (
        f"{block.id}: exit code {result.returncode}, expected {expected}; output:\n"
        f"{result.stdout[-6000:]}"
    )
    if block.expected_output is not None:
        _check_output(block, result.stdout)


def test_ci_runs_the_readme_commands_as_written():
    """The README's command block is the one `.ci/run` reads and runs, line by line."""
    spec = importlib.util.spec_from_file_location(
        "readme_commands", REPO / ".ci/readme_commands.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ci_blocks = [b for b in ALL if b.kind == "ci"]
    assert [b.page.name for b in ci_blocks] == ["README.md"], "one `ci` block, in the README"
    expected = [line.strip() for line in ci_blocks[0].code.splitlines() if line.strip()]
    assert module.readme_commands(REPO / "README.md") == expected
    assert [c.split("#")[0].split("&&")[-1].split() for c in expected] == [
        ["nox", "-s", "demo"],
        ["nox"],
    ], "the README's first command is the demo, the second the test suite"
    assert "readme_commands.py" in (REPO / ".ci/run").read_text()
