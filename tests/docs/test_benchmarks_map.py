"""docs/benchmarks.md is a map of the current figures, one table per area; the narrative of every
run is in docs/benchmarks-log.md. These checks keep the map usable: every row has its six cells
and a value, every command starts with a script or tool that exists, every link lands on a file
and heading that exist, the areas are there in order, and every section of the log is reachable
from the map. Pure text parsing: no subprocess, no import of the project."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "benchmarks.md"
LOG = ROOT / "docs" / "benchmarks-log.md"

COLUMNS = ["figure", "value", "command", "commit", "date", "details"]
# The areas, in this order (a level-2 heading each). "Test suite: time": tests/conftest.py cites
# `docs/benchmarks.md, "Test suite: time"`.
AREAS = [
    "Verifier",
    "Rollout",
    "Weight sync",
    "Packing",
    "Training loop",
    "Test suite: time",
    "Demo learning (CPU demo)",
    "Ablation",
    "GPU checks",
    "Evaluation",
]
# Words a command may start with before the script's path: interpreters (python, python3, or a
# virtual environment's, e.g. .venv/bin/python or /tmp/mvenv/bin/python), bash, sbatch.
_LAUNCHERS = {"python", "python3", "bash", "sh", "sbatch"}
_INTERPRETER = re.compile(r"^(?:\S*/)?python3?(?:\.\d+)?$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _outside_fences(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield n, line


def _slug(title: str) -> str:
    """GitHub's heading anchor: lowercase, punctuation dropped, spaces to '-'."""
    t = title.strip().lower()
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")


def _headings(path: Path) -> list:
    """(level, title) of the headings of a markdown file, outside fenced blocks."""
    out = []
    for _, line in _outside_fences(path.read_text()):
        m = re.match(r"^(#{1,6}) +(.+?) *#* *$", line)
        if m:
            out.append((len(m.group(1)), m.group(2).strip()))
    return out


def _anchors(path: Path) -> set:
    """Every heading anchor of a file, duplicates numbered as GitHub does (-1, -2, ...)."""
    seen, out = {}, set()
    for _, title in _headings(path):
        s = _slug(title)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def _cells(line: str) -> list:
    """The cells of a table row: split on '|' outside backtick spans and not escaped."""
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    cells, cur, tick, i = [], [], False, 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] == "|":
            cur.append("|")
            i += 2
            continue
        if c == "`":
            tick = not tick
        if c == "|" and not tick:
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    cells.append("".join(cur).strip())
    return cells


def _tables(text: str) -> list:
    """Every table outside fenced blocks: (line number of its header, area, header, rows), rows
    being (line number, cells) of the data rows."""
    tables, area, current = [], None, None
    for n, line in _outside_fences(text):
        m = re.match(r"^## +(.+?)\s*$", line)
        if m:
            area = m.group(1)
        if line.lstrip().startswith("|"):
            cells = _cells(line)
            if current is None:
                current = (n, area, cells, [])
                tables.append(current)
            elif all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                continue
            else:
                current[3].append((n, cells))
        else:
            current = None
    return tables


def _rows():
    return [(n, area, cells) for _, area, _, rows in _tables(MAP.read_text()) for n, cells in rows]


def _command(cell: str):
    """The command of a command cell: its first backtick span."""
    m = re.search(r"`([^`]+)`", cell)
    return m.group(1) if m else None


def command_path(command: str):
    """The first path-like word of a command (containing '/' or ending in .py/.sh), after an
    optional leading launcher (python, a virtual environment's python, bash, sbatch) and
    environment assignments (X=1, CI=true); None if it has none."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    i = 0
    while i < len(words) and (_ASSIGNMENT.match(words[i]) or words[i] in _LAUNCHERS or _INTERPRETER.match(words[i])):
        i += 1
    for w in words[i:]:
        if "/" in w or w.endswith((".py", ".sh")):
            return w
    return None


def _links(text: str):
    """(line number, target) of every markdown link outside fenced blocks (not web links)."""
    for n, line in _outside_fences(text):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if not re.match(r"^[a-z]+://", target) and not target.startswith("mailto:"):
                yield n, target


def _link_problem(target: str, base: Path):
    path, _, frag = target.partition("#")
    f = (base.parent / path).resolve() if path else base
    if not f.is_file():
        return f"({target}): {f} is not a file of the repository"
    if frag and f.suffix == ".md" and frag not in _anchors(f):
        return f"({target}): no heading with the anchor #{frag} in {f.relative_to(ROOT)}"
    if frag and f.suffix != ".md":
        return f"({target}): an anchor into a file that is not markdown"
    return None


# ---------------------------------------------------------------------------- the checks


def test_every_table_has_the_six_columns_and_every_row_a_value():
    tables = _tables(MAP.read_text())
    assert tables, "docs/benchmarks.md has no table"
    problems = []
    for n, area, header, rows in tables:
        if [c.lower() for c in header] != COLUMNS:
            problems.append(f"line {n} ({area}): header {header}, expected {COLUMNS}")
        if not rows:
            problems.append(f"line {n} ({area}): a table without rows")
        for ln, cells in rows:
            if len(cells) != len(COLUMNS):
                problems.append(f"line {ln} ({area}): {len(cells)} cells, expected {len(COLUMNS)}: {cells}")
                continue
            row = dict(zip(COLUMNS, cells))
            if not row["figure"] or not row["value"]:
                problems.append(f"line {ln} ({area}): empty figure or value")
            if not re.fullmatch(r"[0-9a-f]{7,40}|n/a", row["commit"]):
                problems.append(f"line {ln} ({area}): commit {row['commit']!r} is neither a short hash nor n/a")
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}|n/a", row["date"]):
                problems.append(f"line {ln} ({area}): date {row['date']!r} is neither YYYY-MM-DD nor n/a")
            if "n/a" in (row["commit"], row["date"]) and not re.search(
                r"\bno commit|\bno date|neither|names no|gives no", row["details"], re.I
            ):
                problems.append(f"line {ln} ({area}): commit or date n/a, and details do not say the log names none")
    assert not problems, "docs/benchmarks.md:\n" + "\n".join(problems)


def test_every_command_starts_with_a_file_of_the_repository():
    problems = []
    rows = _rows()
    assert rows
    for ln, area, cells in rows:
        if len(cells) != len(COLUMNS):
            continue  # reported by the test above
        cmd = _command(cells[2])
        if cmd is None:
            problems.append(f"line {ln} ({area}): the command cell has no command in backticks: {cells[2]!r}")
            continue
        path = command_path(cmd)
        if path is None:
            problems.append(f"line {ln} ({area}): no script or tool path in `{cmd}`")
        elif not (ROOT / path).is_file():
            problems.append(f"line {ln} ({area}): `{cmd}`: {path} is not a file of the repository")
    assert not problems, "docs/benchmarks.md:\n" + "\n".join(problems)


def test_every_details_cell_links_to_the_log_or_a_raw_file():
    problems = []
    for ln, area, cells in _rows():
        if len(cells) != len(COLUMNS):
            continue
        targets = re.findall(r"\]\(([^)\s]+)\)", cells[5])
        if not any(
            t.startswith("benchmarks-log.md#") or t.startswith(("images/", "../benchmarks/results/")) for t in targets
        ):
            problems.append(
                f"line {ln} ({area}): details link neither to a section of benchmarks-log.md nor to a raw file"
            )
    assert not problems, "docs/benchmarks.md:\n" + "\n".join(problems)


def test_every_link_lands_on_a_file_and_heading():
    problems = []
    for doc in (MAP, LOG):
        for ln, target in _links(doc.read_text()):
            p = _link_problem(target, doc)
            if p:
                problems.append(f"{doc.name} line {ln}: link {p}")
    assert not problems, "\n".join(problems)


def test_the_areas_in_order():
    level2 = [t for level, t in _headings(MAP) if level == 2]
    missing = [a for a in AREAS if a not in level2]
    assert not missing, f"docs/benchmarks.md lacks the area headings {missing} (has {level2})"
    order = [t for t in level2 if t in AREAS]
    assert order == AREAS, f"areas out of order: {order}"
    # every table sits under an area heading
    stray = [(n, area) for n, area, _, _ in _tables(MAP.read_text()) if area not in level2]
    assert not stray, f"tables outside an area: {stray}"


def test_every_section_of_the_log_is_reachable_from_the_map():
    linked = {t.partition("#")[2] for _, t in _links(MAP.read_text()) if t.startswith("benchmarks-log.md#")}
    seen, missing = {}, []
    for level, title in _headings(LOG):
        s = _slug(title)
        n = seen.get(s, 0)
        seen[s] = n + 1
        anchor = s if n == 0 else f"{s}-{n}"
        if level >= 2 and anchor not in linked:
            missing.append(title)
    assert not missing, f"sections of docs/benchmarks-log.md no row or note of the map links to: {missing}"


def test_command_path_parsing():
    assert command_path(".venv/bin/python benchmarks/bench_rollout.py --small") == "benchmarks/bench_rollout.py"
    assert (
        command_path("/tmp/mvenv/bin/python benchmarks/bench_verifier.py --repeats 1") == "benchmarks/bench_verifier.py"
    )
    assert command_path("CI=true bash .ci/run") == ".ci/run"
    assert command_path("X=1 sbatch examples/slurm_qwen32b.sbatch") == "examples/slurm_qwen32b.sbatch"
    assert command_path("benchmarks/demo_ab.py dca092d b1d3af3") == "benchmarks/demo_ab.py"
    assert command_path("python -m pytest tests/foundation") == "tests/foundation"
    assert command_path("make all") is None
    assert _cells("| a | `x | y` | c \\| d |") == ["a", "`x | y`", "c | d"]
