"""docs/quickstart-cluster.md, command by command.

Every fenced block of the page carries an HTML comment ``<!-- quickstart-test: KIND ... -->``
on the line before it (the page's last section explains them to readers):

* ``vars``: the paths of step 0. Not run; every variable it sets has a stand-in here.
* ``cpu [hf=tiny] [dirs=run] [append="NEEDLE: ARGS"] [expect=S] [forbid=S] [expect-fail=S]``:
  run in bash (``-euo pipefail``) from the repository root with stand-ins. HF_CKPT is
  examples/qwen2.5-32b (Qwen2.5-32B's public config.json, shape only) plus the Qwen2
  tokenizer; with ``hf=tiny`` the tiny random Qwen2 of tests/e2e/fixtures.py. The data are
  the real files in tests/data. SAVE_DIR / RUN_DIR / INIT_CKPT are temporary directories;
  with ``dirs=run`` those of a real one-step CPU run of the driver. ``append`` adds CPU-sized
  flags to the command containing NEEDLE (the last value of a flag wins). ``expect`` /
  ``forbid``: text the output must / must not contain. ``expect-fail``: a known bug, xfail
  while the command fails with that text, a failure once it works (so the page gets updated).
* ``skip "REASON"``: not run (needs a GPU cluster, Slurm or the network); the test says why.
* ``row "FILE"`` (json): equal to the first row of FILE; ``row-minimal`` (json): one jsonl row
  that the trainer's loader accepts.

test_static_checks covers what is not run: every repository path on the page exists; links,
quoted section titles and quotations of other docs exist; in the blocks not run, every flag
given to run_qwen32b.sh, submit_dapo.sbatch or ``python -m megatron_dapo.train`` parses with
megatron_dapo.config, the flags of tools/*.py, ``hf download`` and ``tensorboard`` are in their
``--help``, Slurm's are in a short list (no Slurm here); every flag in the prose belongs to the
driver, a tool of the page or that list. (The parsers of the blocks that run refuse unknown
flags themselves.)

Nothing here downloads (HF_HUB_OFFLINE=1); every process a block starts is ended with it
(tests/launch/procs.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, run_in_session

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "quickstart-cluster.md"
DATA = ROOT / "tests" / "data"
PROMPT_SAMPLE = DATA / "train" / "dapo-math-17k-head16.parquet"
AIME = DATA / "eval" / "aime-2024.parquet"

#: The variables of step 0 and what stands in for them here (see stand_in_env).
STAND_IN_VARS = ("MEGATRON_DAPO", "HF_CKPT", "PROMPT_DATA", "EVAL_DATA", "SAVE_DIR", "RUN_DIR", "INIT_CKPT")
#: Environment that would change what the scripts do (a Slurm job, a Ray cluster, earlier settings).
DROPPED_ENV = (
    "RAY_ADDRESS",
    "DRY_RUN",
    "NUM_ROLLOUT",
    "NNODES",
    "GPUS_PER_NODE",
    "PYTHON",
    "REPO_ROOT",
    "DRIVER_SCRIPT",
    "NODELIST",
    "SHARED_DATA",
    "MASTER_ADDR",
    "TOKENIZER",
)
#: Slurm options the page may use (no Slurm here to ask).
SLURM_FLAGS = {
    "--time",
    "--parsable",
    "--dependency",
    "--nodes",
    "--gpus-per-task",
    "--gres",
    "--export",
    "--pty",
    "--partition",
    "--account",
    "--ntasks",
    "--cpus-per-task",
}
#: Scripts whose extra arguments go to the driver.
DRIVER_SCRIPTS = ("examples/run_qwen32b.sh", "examples/slurm/submit_dapo.sbatch")
REPO_DIRS = ("examples", "tools", "scripts", "docs", "tests", "benchmarks", "megatron_dapo")
MARKER = re.compile(r"^<!--\s*quickstart-test:\s*(.*?)\s*-->\s*$")
KINDS = {"vars", "cpu", "skip", "row", "row-minimal"}
CPU_OPTIONS = {"hf", "dirs", "append", "expect", "forbid", "expect-fail"}
BLOCK_TIMEOUT_S = 300


# ---------------------------------------------------------------------------- the page


@dataclasses.dataclass
class Block:
    line: int  # line of the opening fence (1-based)
    lang: str
    text: str
    kind: str
    options: dict
    arg: str  # the positional argument: skip's reason, row's file
    section: str

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower())[:28].strip("-")
        return f"L{self.line}-{self.kind}-{slug}"


def parse_doc(text: str) -> tuple[list, list]:
    """(blocks, problems): the fenced blocks with their markers; what is malformed."""
    lines = text.splitlines()
    blocks, problems = [], []
    section, i = "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        m = re.match(r"^```(\w*)\s*$", line)
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body = "\n".join(lines[i + 1 : j]) + "\n"
        prev = lines[start - 1] if start > 0 else ""
        mm = MARKER.match(prev)
        if not mm:
            problems.append(
                f"line {start + 1}: a ```{lang} block without a <!-- quickstart-test: ... --> line before it"
            )
            kind, options, arg = "", {}, ""
        else:
            words = shlex.split(mm.group(1))
            kind, options, pos = (words[0] if words else ""), {}, []
            for w in words[1:]:
                if "=" in w and re.match(r"^[\w-]+=", w):
                    k, v = w.split("=", 1)
                    options[k] = v
                else:
                    pos.append(w)
            arg = " ".join(pos)
            if kind not in KINDS:
                problems.append(f"line {start}: unknown marker kind {kind!r} (known: {sorted(KINDS)})")
            if kind in ("cpu", "skip", "vars") and lang != "bash":
                problems.append(f"line {start + 1}: a {kind} marker on a ```{lang} block (expected bash)")
            if kind in ("row", "row-minimal") and lang != "json":
                problems.append(f"line {start + 1}: a {kind} marker on a ```{lang} block (expected json)")
            if kind == "skip" and not arg:
                problems.append(f"line {start}: a skip marker must state why the block is not run")
            if kind == "cpu" and set(options) - CPU_OPTIONS:
                problems.append(f"line {start}: unknown cpu options {sorted(set(options) - CPU_OPTIONS)}")
            if kind != "cpu" and options:
                problems.append(f"line {start}: options {sorted(options)} only apply to cpu blocks")
        blocks.append(Block(start + 1, lang, body, kind, options, arg, section))
        i = j + 1
    return blocks, problems


DOC_TEXT = DOC.read_text()
BLOCKS, MARKER_PROBLEMS = parse_doc(DOC_TEXT)


def _heredoc_free(text: str) -> str:
    """The block without the bodies of here-documents (python code is not shell)."""
    out, end = [], None
    for line in text.splitlines():
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        m = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", line)
        if m:
            end = m.group(1)
        out.append(line)
    return "\n".join(out)


def logical_lines(text: str) -> list:
    """Physical lines joined at trailing backslashes, here-document bodies dropped."""
    out, cur = [], ""
    for line in _heredoc_free(text).splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
        else:
            out.append(cur + line)
            cur = ""
    if cur:
        out.append(cur)
    return [line for line in out if line.strip()]


def segments(line: str) -> list:
    """The simple commands of one logical line, as word lists (comments dropped; split at
    pipes, lists and command substitutions)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    segs, cur = [], []
    for tok in lex:
        if tok and all(c in "|;&()<>" for c in tok):
            if cur:
                segs.append(cur)
            cur = []
            continue
        cur.append(tok)
    if cur:
        segs.append(cur)
    out = []
    for seg in segs:
        while seg and re.match(r"^[A-Za-z_]\w*=", seg[0]):  # leading assignments
            seg = seg[1:]
        if seg:
            out.append(seg)
    return out


def leading_assignments(line: str) -> list:
    """Names assigned in front of the commands of a logical line (``NUM_ROLLOUT=2 sbatch ...``)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    names, at_start = [], True
    for tok in lex:
        if tok and all(c in "|;&()<>" for c in tok):
            at_start = True
            continue
        m = re.match(r"^([A-Za-z_]\w*)=", tok)
        if at_start and m:
            names.append(m.group(1))
            continue
        at_start = False
    return names


def long_flags(words) -> list:
    return [w.split("=", 1)[0] for w in words if re.match(r"^--[A-Za-z][\w-]*(=.*)?$", w)]


# ---------------------------------------------------------------------------- what accepts which flags


@functools.lru_cache(maxsize=None)
def driver_flags() -> frozenset:
    from megatron_dapo.config.cli import REMOVED_FLAGS, build_parser

    flags = {s for a in build_parser()._actions for s in a.option_strings if s.startswith("--")}
    return frozenset(flags - set(REMOVED_FLAGS))


def _help_flags(cmd: list) -> frozenset:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "200"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}"
    return frozenset(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", p.stdout + p.stderr))


@functools.lru_cache(maxsize=None)
def tool_flags(tool: str) -> frozenset:
    path = ROOT / tool
    assert path.is_file(), f"{tool} does not exist"
    return _help_flags([sys.executable, str(path), "--help"])


def _venv_bin(name: str):
    found = Path(sys.executable).parent / name
    return str(found) if found.exists() else shutil.which(name)


@functools.lru_cache(maxsize=None)
def program_flags(prog: str):
    """Flags of a third-party program that is installed here (``hf download``, ``wandb sync``,
    ``tensorboard``); None when it is not installed (then not checked)."""
    name, *sub = prog.split()
    exe = _venv_bin(name)
    if exe is None:
        return None
    return _help_flags([exe, *sub, "--help"])


def classify(words: list):
    """(owner, args, extra) of one simple command. owner: 'driver', 'tool:<path>', 'slurm',
    'prog:<name>', 'pip' or 'unchecked:<name>'; args: the words whose flags the owner accepts.
    For sbatch, extra holds the driver arguments after the batch script."""
    prog = os.path.basename(words[0])
    if prog == "bash" and len(words) > 1 and words[1] in DRIVER_SCRIPTS:
        return "driver", words[2:], None
    if prog == "sbatch":
        for k, w in enumerate(words):
            if w.endswith(".sbatch"):
                return "slurm", words[1:k], (w, words[k + 1 :])
        return "slurm", words[1:], None
    if prog.startswith("python"):
        if words[1:3] == ["-m", "megatron_dapo.train"]:
            return "driver", words[3:], None
        if len(words) > 1 and words[1].endswith(".py"):
            return f"tool:{words[1]}", words[2:], None
        return f"unchecked:{prog} {words[1] if len(words) > 1 else ''}".rstrip(), words[1:], None
    if prog in ("hf", "huggingface-cli") and words[1:2] == ["download"]:
        return "prog:hf download", words[2:], None
    if prog == "wandb" and words[1:2] == ["sync"]:
        return "prog:wandb sync", words[2:], None
    if prog == "tensorboard":
        return "prog:tensorboard", words[1:], None
    if prog == "pip":
        return "pip", words[1:], None
    return f"unchecked:{prog}", words[1:], None


# ---------------------------------------------------------------------------- stand-ins


def stand_in_env(tmp: Path, hf_ckpt: str, save_dir: str, run_dir: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLURM_") and k not in DROPPED_ENV and k not in STAND_IN_VARS
    }
    env.update(
        MEGATRON_DAPO=str(ROOT),
        HF_CKPT=hf_ckpt,
        PROMPT_DATA=str(PROMPT_SAMPLE),
        EVAL_DATA=str(AIME),
        SAVE_DIR=save_dir,
        RUN_DIR=run_dir,
        INIT_CKPT=str(tmp / "init-ckpt"),
        # no fallback to ../shared/data: the stand-ins above must be what the scripts use
        SHARED_DATA=str(tmp / "no-shared-data"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(tmp / "hf-home"),
        WANDB_CONFIG_DIR=str(tmp / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp / "wandb-data"),
        WANDB_SILENT="true",
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return env


@pytest.fixture(scope="module")
def config32b(tmp_path_factory) -> str:
    """Qwen2.5-32B without its weights: examples/qwen2.5-32b (the public config.json, marked
    shape-only for the dry run) and the Qwen2 tokenizer."""
    from tests.data import qwen2_tokenizer_dir

    d = tmp_path_factory.mktemp("qwen2.5-32b-config")
    for f in (ROOT / "examples" / "qwen2.5-32b").iterdir():  # config.json and its shape-only marker
        shutil.copy(f, d / f.name)
    for f in Path(qwen2_tokenizer_dir()).iterdir():
        shutil.copy(f, d / f.name)
    return str(d)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> str:
    from tests.e2e.fixtures import make_tiny_qwen2_dir

    return make_tiny_qwen2_dir(str(tmp_path_factory.mktemp("tiny") / "hf"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_hf):
    """A real one-step DAPO run of the driver on the CPU (the tiny Qwen2 and parity reward of
    tests/e2e/fixtures.py, the 16-row DAPO-Math sample, the HF engine, gloo, Ray): its RUN_DIR
    (metrics, tensorboard, wandb offline, an HF export) and SAVE_DIR (a trainer checkpoint)
    stand in for the 32B run's."""
    d = tmp_path_factory.mktemp("run")
    run_dir, save_dir = d / "run", d / "save"
    args = [
        "--hf-checkpoint",
        tiny_hf,
        "--prompt-data",
        str(PROMPT_SAMPLE),
        "--rollout-engine",
        "hf",
        "--num-rollout",
        "1",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "4",
        "--micro-batch-size",
        "4",
        "--max-response-length",
        "8",
        "--overlong-buffer-length",
        "2",
        "--overlong-filter",
        "false",
        "--max-prompt-length",
        "400",
        "--prompt-overflow",
        "truncate-left",
        "--lr",
        "1e-4",
        "--seed",
        "1234",  # run_qwen32b.sh's (the default): the doc's resume through it must use the run's seed
        "--use-distributed-optimizer",  # as run_qwen32b.sh: the resume check compares the optimizer format
        # a random model never solves math: a reward with mixed groups (tests/e2e/fixtures.py)
        "--reward-fn",
        "tests.e2e.fixtures:parity_reward",
        "--reward-num-workers",
        "1",
        "--run-dir",
        str(run_dir),
        "--save",
        str(save_dir),
        "--save-interval",
        "1",
        "--save-hf-interval",
        "1",
        "--tensorboard",
        "--wandb-mode",
        "offline",
        "--no-progress",
    ]
    env = stand_in_env(d, tiny_hf, str(save_dir), str(run_dir))
    p = run_in_session(
        [sys.executable, "-m", "megatron_dapo.train", *args], 420, grace_s=RAY_SHUTDOWN_GRACE_S, env=env, cwd=ROOT
    )
    assert p.returncode == 0, f"the tiny CPU run failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    assert not p.leftovers, f"the tiny run left processes behind: {p.leftovers}"
    return str(run_dir), str(save_dir)


# ---------------------------------------------------------------------------- static checks


def _slug(title: str) -> str:
    """GitHub's heading anchor."""
    t = re.sub(r"[`*_]", "", title.strip().lower())
    t = re.sub(r"[^\w\- ]", "", t)
    return t.replace(" ", "-")


def _headings(path: Path) -> list:
    out, fence = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"^#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def _prose(text: str) -> str:
    """The page without its fenced blocks and markers."""
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence and not MARKER.match(line):
            out.append(line)
    return "\n".join(out)


def _repo_paths(text: str) -> set:
    pat = r"(?<![\w./$-])((?:%s)/[\w.*?/-]*[\w*?])" % "|".join(REPO_DIRS)
    return set(re.findall(pat, text))


def check_paths_and_references(problems: list) -> None:
    prose = _prose(DOC_TEXT)
    for rel in sorted(_repo_paths(DOC_TEXT)):
        if not glob.glob(str(ROOT / rel)):
            problems.append(f"{rel}: named on the page, not in the repository")
    # markdown links: the file, and the heading of an anchor
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, frag = target.partition("#")
        f = (DOC.parent / path).resolve() if path else DOC
        if not f.exists():
            problems.append(f"link ({target}): {f} does not exist")
        elif frag and frag not in {_slug(h) for h in _headings(f)}:
            problems.append(f"link ({target}): no heading with the anchor #{frag} in {f.name}")
    # `docs/x.md, "Section"`: a heading of that doc begins with the quoted title
    for path, title in re.findall(r"((?:docs/)?[\w-]+\.md)\s*,\s*\"([^\"]+)\"", prose):
        f = ROOT / path if path.startswith("docs/") or path == "README.md" else ROOT / "docs" / path
        if not f.exists():
            problems.append(f'{path}, "{title}": {path} does not exist')
        elif not any(h.lower().startswith(title.lower()) for h in _headings(f)):
            problems.append(f'{path}, "{title}": no such section in {path} (headings: {_headings(f)})')
    # quotations of other docs (*"..."*) must still be what they say
    others = [p.read_text() for p in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"] if p != DOC]
    for quote in re.findall(r"\*\"(.+?)\"\*", prose, flags=re.S):
        q = " ".join(quote.split())
        if not any(q in " ".join(t.split()) for t in others):
            problems.append(f'the quotation "{q}" is no longer in any doc: update the page')


def check_flags(problems: list, notes: list) -> None:
    """Every --flag of the shell blocks that are not run (or run expecting a failure), and every
    --flag in the prose; the names assigned in front of commands (``NUM_ROLLOUT=2 sbatch``) in
    every block."""
    env = {v: f"/stand-in/{v.lower()}" for v in STAND_IN_VARS}
    scripts_env = {s: (ROOT / s).read_text() for s in DRIVER_SCRIPTS}
    for b in BLOCKS:
        if b.lang != "bash":
            continue
        for line in logical_lines(b.text):
            for name in leading_assignments(line):
                if name in STAND_IN_VARS:
                    continue
                users = [s for s, t in scripts_env.items() if "${" + name in t or f'"${name}"' in t]
                if not users and f"${name}" not in b.text and "${" + name not in b.text:  # not a shell variable
                    problems.append(f"line {b.line}: {name}=... is read by none of {DRIVER_SCRIPTS}")
            if b.kind == "cpu" and "expect-fail" not in b.options:
                continue  # run by test_block: the parsers themselves refuse an unknown flag
            for words in segments(line):
                owner, args, extra = classify(words)
                flags = long_flags(args)
                where = f"line {b.line}: `{' '.join(words)[:90]}`"
                if owner == "driver":
                    check_driver_args(args, env, where, problems)
                elif owner == "slurm":
                    bad = [f for f in flags if f not in SLURM_FLAGS]
                    if bad:
                        problems.append(f"{where}: Slurm flags {bad} are not in the list this test knows")
                    if extra:
                        script, driver_args = extra
                        if script not in DRIVER_SCRIPTS:
                            problems.append(f"{where}: {script} is not a batch script of this repository")
                        check_driver_args(driver_args, env, where, problems)
                elif owner.startswith("tool:"):
                    tool = owner.split(":", 1)[1]
                    if not (ROOT / tool).is_file():
                        problems.append(f"{where}: {tool} does not exist")
                        continue
                    bad = [f for f in flags if f not in tool_flags(tool)]
                    if bad:
                        problems.append(f"{where}: {tool} has no {bad} (its --help)")
                elif owner.startswith("prog:"):
                    known = program_flags(owner.split(":", 1)[1])
                    if known is None:
                        notes.append(f"{where}: flags not checked ({owner[5:]} is not installed here)")
                    elif [f for f in flags if f not in known]:
                        problems.append(f"{where}: {owner[5:]} has no {[f for f in flags if f not in known]}")
                elif owner == "pip":
                    for extra_name in re.findall(r"\.\[([\w,-]+)\]", " ".join(args)):
                        for e in extra_name.split(","):
                            if not re.search(r'^\s*"%s"\s*:' % re.escape(e), (ROOT / "setup.py").read_text(), re.M):
                                problems.append(f"{where}: setup.py has no extra {e!r}")
                elif flags:
                    notes.append(f"{where}: flags {flags} of {owner.split(':', 1)[1]} not checked (third-party)")
    # flags named in the prose: the driver's, one of this repository's tools', or Slurm's
    tools = sorted(p for p in _repo_paths(DOC_TEXT) if p.startswith("tools/") and p.endswith(".py") and "*" not in p)
    for flag in sorted(set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", _prose(DOC_TEXT)))):
        if flag in driver_flags() or flag in SLURM_FLAGS or any(flag in tool_flags(t) for t in tools):
            continue
        problems.append(f"the page names {flag}: no flag of the driver, of {tools} or of Slurm's list")


def check_driver_args(args: list, env: dict, where: str, problems: list) -> None:
    from megatron_dapo.config import parse_args

    expanded = [
        re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: env.get(m.group(1) or m.group(2), m.group(0)), a) for a in args
    ]
    bad = [f for f in long_flags(expanded) if f not in driver_flags()]
    if bad:
        problems.append(f"{where}: the driver has no {bad}")
        return
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse_args(expanded)
    except SystemExit:
        problems.append(f"{where}: the driver's parser refuses {expanded}: {err.getvalue().strip()[-300:]}")
    except Exception as e:  # a ConfigError from a YAML key and the like
        problems.append(f"{where}: the driver's parser refuses {expanded}: {e}")


def test_every_block_is_marked():
    assert BLOCKS, f"{DOC} has no fenced blocks"
    assert not MARKER_PROBLEMS, "\n".join(MARKER_PROBLEMS)
    kinds = {b.kind for b in BLOCKS}
    assert {"vars", "cpu", "skip"} <= kinds, kinds


def test_vars_block_has_a_stand_in_for_every_path():
    (b,) = [b for b in BLOCKS if b.kind == "vars"]
    names = re.findall(r"^export (\w+)=", b.text, flags=re.M)
    assert sorted(names) == sorted(STAND_IN_VARS), f"step 0 sets {names}; stand-ins exist for {STAND_IN_VARS}"
    # "examples/run_qwen32b.sh reads the same names"
    script = (ROOT / "examples" / "run_qwen32b.sh").read_text()
    for name in ("HF_CKPT", "PROMPT_DATA", "EVAL_DATA", "SAVE_DIR", "RUN_DIR"):
        assert re.search(r'\b%s="\$\{%s:?-' % (name, name), script), f"run_qwen32b.sh no longer reads {name}"


def test_static_checks():
    """Paths, links, sections and quotations of the whole page; the flags of the blocks not run and of the prose."""
    problems, notes = [], []
    check_paths_and_references(problems)
    check_flags(problems, notes)
    for n in notes:
        print(n)
    assert not problems, "docs/quickstart-cluster.md:\n" + "\n".join(problems)


def test_json_rows(tmp_path):
    """The example row is the first row of the real file; the minimal row loads with the trainer's loader."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from megatron_dapo.data import load_prompt_dataset
    from tests.data import qwen2_tokenizer_dir

    rows = [b for b in BLOCKS if b.kind == "row"]
    minimal = [b for b in BLOCKS if b.kind == "row-minimal"]
    assert rows and minimal
    for b in rows:
        real = pq.read_table(ROOT / b.arg).to_pylist()[0]
        assert json.loads(b.text) == real, f"line {b.line}: the example is not the first row of {b.arg}"
        # "DAPO-Math-17K rows have the same columns"
        sample = pq.read_table(PROMPT_SAMPLE).schema.names
        assert set(sample) == set(real) - {"__index_level_0__"}, (sample, sorted(real))
    tok = AutoTokenizer.from_pretrained(qwen2_tokenizer_dir())
    for b in minimal:
        row = json.loads(b.text)
        f = tmp_path / f"row-{b.line}.jsonl"
        f.write_text(json.dumps(row) + "\n")
        ds = load_prompt_dataset(str(f), tok, max_prompt_length=2048)
        assert len(ds) == 1 and ds[0].ground_truth == row["reward_model"]["ground_truth"]
        assert row["prompt"] in ds[0].prompt_text  # rendered with the chat template


# ---------------------------------------------------------------------------- the blocks


def _join_continuations(script: str) -> list:
    out, cur = [], ""
    for line in script.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
        else:
            out.append(cur + line)
            cur = ""
    return out + ([cur] if cur else [])


def _command_end(line: str, start: int) -> int:
    """Where the simple command running at ``start`` ends: the first unquoted |, ;, &, ) or
    comment after it, or the end of the line."""
    quote, i = None, start
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = None
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c in "|;&)" or (c == "#" and line[i - 1].isspace()):
            return i
        i += 1
    return len(line)


def _append(script: str, spec: str) -> str:
    """``NEEDLE: ARGS``: ARGS added at the end of the first command containing NEEDLE."""
    needle, _, extra = spec.partition(": ")
    out, done = [], False
    for line in _join_continuations(script):
        at = line.find(needle)
        if at >= 0 and not done:
            end = _command_end(line, at + len(needle))
            rest = line[end:].strip()
            line = f"{line[:end].rstrip()} {extra}" + (f" {rest}" if rest else "")
            done = True
        out.append(line)
    assert done, f"append={spec!r}: no command of the block contains {needle!r}"
    return "\n".join(out) + "\n"


def _params():
    out = []
    for b in BLOCKS:
        if b.kind not in ("cpu", "skip"):
            continue
        slow = b.options.get("dirs") == "run" or b.options.get("hf") == "tiny"
        out.append(pytest.param(b, id=b.id, marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize("block", _params())
def test_block(block, request, tmp_path):
    if block.kind == "skip":
        pytest.skip(f"not run: {block.arg} (its paths and flags: test_static_checks)")
    o = block.options
    hf = request.getfixturevalue("tiny_hf") if o.get("hf") == "tiny" else request.getfixturevalue("config32b")
    if o.get("dirs") == "run":
        run_dir, save_dir = request.getfixturevalue("tiny_run")
    else:  # like the cluster's /shared/...: not on this machine yet (its disk is not the run's)
        run_dir, save_dir = str(tmp_path / "shared" / "runs" / "run"), str(tmp_path / "shared" / "ckpt" / "save")
    script = _append(block.text, o["append"]) if "append" in o else block.text
    env = stand_in_env(tmp_path, hf, save_dir, run_dir)
    # grace: helper processes that are already exiting (a checkpoint writer's forks)
    p = run_in_session(["bash", "-euo", "pipefail", "-c", script], BLOCK_TIMEOUT_S, grace_s=15.0, env=env, cwd=ROOT)
    out = p.stdout + p.stderr
    shown = f"line {block.line} of {DOC.name}:\n{script}\n--- exit {p.returncode}, output:\n{out[-6000:]}"
    assert not p.leftovers, f"processes left behind: {p.leftovers}\n{shown}"
    if "expect-fail" in o:
        if p.returncode == 0:
            pytest.fail(f"the command now works: drop expect-fail and the 'not working yet' note\n{shown}")
        assert o["expect-fail"] in out, f"fails, but not with {o['expect-fail']!r}\n{shown}"
        pytest.xfail(f"known bug, line {block.line}: {o['expect-fail']}")
    assert p.returncode == 0, shown
    if o.get("expect"):
        assert o["expect"] in out, f"expected {o['expect']!r} in the output\n{shown}"
    if o.get("forbid"):
        assert o["forbid"] not in out, f"{o['forbid']!r} in the output: a stand-in was not used\n{shown}"
