"""The pinned GPU stack resolves: the ``gpu`` extra's wheels declare requirements that agree with
each other and with our own requirements (setup.py).

No GPU package is installed or imported. The extra pins one set per supported Python (environment
markers: the primary stack on 3.12, the compatibility stack on 3.11); each set is checked for its
own Python. For each ``name==version`` of the ``gpu`` extra, and
for each exact pin those wheels (torch aside: its pins are its CUDA runtime) make themselves
(one level down: sglang's ``sglang-kernel``, ``transformers``, ... which is where a second torch
pin would hide), the wheel's core metadata
(Requires-Dist, Requires-Python) for Linux x86_64 / that CPython is fetched once with pip
(``pip install --dry-run --no-deps --report``; ``--use-feature=fast-deps`` reads only the
METADATA file out of the remote wheel) into ``$MEGATRON_DAPO_WHEEL_METADATA_CACHE`` (default
``~/.cache/megatron_dapo/wheel-metadata``) and reused. If it is neither cached nor fetchable the
test FAILS: an unchecked stack is not a pass.

``transformer_engine_torch`` is published only as an sdist whose requirements are computed when
it builds (``torch>=2.1`` and ``transformer_engine_cu<torch's CUDA major>``); what we check
instead is that the TE meta-package maps our extras to TE packages of the same version and that
the TE core's CUDA major is the one torch was built for.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(
    os.environ.get("MEGATRON_DAPO_WHEEL_METADATA_CACHE") or Path.home() / ".cache" / "megatron_dapo" / "wheel-metadata"
)
PYTHONS = ("3.11", "3.12")  # what setup.py's python_requires and the README support
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in (39, 35, 34, 31, 28, 27, 24, 17)] + [
    "manylinux2014_x86_64",
    "linux_x86_64",
    "any",
]


def marker_env(python: str) -> dict:
    """What an environment marker sees on Linux x86_64 / CPython ``python``."""
    return {
        **default_environment(),
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def setup_lists() -> tuple[list[str], dict[str, list[str]]]:
    """INSTALL_REQUIRES and EXTRAS of setup.py, read with ast (setup.py runs setup() on import)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("INSTALL_REQUIRES", "EXTRAS"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found["INSTALL_REQUIRES"], found["EXTRAS"]


def _pinned_version(req: Requirement):
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
        return Version(specs[0].version)
    return None


@lru_cache(maxsize=None)
def metadata(name: str, version: str, python: str = "3.11") -> dict:
    """Core metadata of the Linux x86_64 / CPython ``python`` wheel of name==version (cached JSON)."""
    key = canonicalize_name(name)
    path = CACHE / (f"{key}-{version}.json" if python == "3.11" else f"{key}-{version}-py{python}.json")
    if path.exists():
        return json.loads(path.read_text())
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "--use-feature=fast-deps",
            "--only-binary=:all:",
            *[a for p in PLATFORMS for a in ("--platform", p)],
            "--python-version",
            python,
            "--implementation",
            "cp",
            "--target",
            str(Path(tmp) / "t"),
            "--report",
            str(report),
            f"{name}=={version}",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            err = proc.stderr[-3000:]
        except subprocess.TimeoutExpired as e:
            err = f"timed out: {e}"
        if not report.exists():
            pytest.fail(
                f"cannot read the metadata of {name}=={version}: `{' '.join(cmd)}` failed:\n{err}\n"
                f"Run it once on a machine with network access or point MEGATRON_DAPO_WHEEL_METADATA_CACHE "
                f"at a directory that holds {path.name}."
            )
        md = json.loads(report.read_text())["install"][0]["metadata"]
    out = {
        "name": md["name"],
        "version": md["version"],
        "requires_dist": md.get("requires_dist") or [],
        "requires_python": md.get("requires_python") or "",
        "provides_extra": md.get("provides_extra") or [],
    }
    path.write_text(json.dumps(out, indent=1))
    return out


def requirements(md: dict, extras=(), python: str = "3.11") -> list[Requirement]:
    """The wheel's requirements that apply on Linux x86_64 / CPython ``python`` with ``extras``."""
    out = []
    env = marker_env(python)
    for line in md["requires_dist"]:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
            out.append(req)
    return out


def _compatible(a: SpecifierSet, b: SpecifierSet) -> bool:
    """Whether some version satisfies both (tried on every version either set names)."""
    if not str(a) or not str(b):
        return True
    candidates = {Version(s.version.replace(".*", "")) for s in (*a, *b)}
    return any(a.contains(v, prereleases=True) and b.contains(v, prereleases=True) for v in candidates)


def _applies(req: Requirement, python: str) -> bool:
    return req.marker is None or req.marker.evaluate({**marker_env(python), "extra": ""})


class Stack:
    """Our requirements and the ``gpu`` extra's pins that apply on Python ``python``."""

    def __init__(self, python: str):
        base, extras = setup_lists()
        self.python = python
        self.ours = {}
        for line in base:
            req = Requirement(line)
            if _applies(req, python):
                assert canonicalize_name(req.name) not in self.ours, (
                    f"setup.py: two requirements of {req.name} on {python}"
                )
                self.ours[canonicalize_name(req.name)] = req
        self.pins = {}
        for line in extras["gpu"]:
            req = Requirement(line)
            assert _pinned_version(req) is not None, f"gpu extra: {line!r} is not pinned to one version (name==x.y.z)"
            if _applies(req, python):
                assert canonicalize_name(req.name) not in self.pins, f"gpu extra: two pins of {req.name} on {python}"
                self.pins[canonicalize_name(req.name)] = req

    def version(self, name: str) -> Version:
        return _pinned_version(self.pins[canonicalize_name(name)])

    def conflicts(self, who: str, reqs) -> list[str]:
        """Where ``who``'s requirements disagree with our pins or our base requirements."""
        out = []
        for r in reqs:
            n = canonicalize_name(r.name)
            if n in self.pins:
                v = self.version(n)
                if not r.specifier.contains(v, prereleases=True):
                    out.append(f"{who} requires {r}, the gpu extra pins {self.pins[n]}")
            elif n in self.ours and not _compatible(r.specifier, self.ours[n].specifier):
                out.append(f"{who} requires {r}, setup.py requires {self.ours[n]}")
        return out


@pytest.fixture(scope="module", params=PYTHONS, ids=[f"py{p}" for p in PYTHONS])
def stack(request) -> Stack:
    return Stack(request.param)


def test_gpu_extra_pins_the_whole_set(stack):
    assert {"torch", "sglang", "megatron-core", "transformer-engine", "torch-memory-saver"} <= set(stack.pins), (
        f"the gpu extra must pin torch, sglang, megatron-core, transformer-engine and torch-memory-saver; it pins "
        f"{sorted(stack.pins)}"
    )


def test_our_gpu_pins_satisfy_our_base_requirements(stack):
    for n, pin in stack.pins.items():
        if n in stack.ours:
            assert stack.ours[n].specifier.contains(stack.version(n), prereleases=True), (
                f"gpu extra pins {pin} but setup.py's base requirement is {stack.ours[n]}"
            )


def test_pinned_wheels_agree_with_the_stack_and_with_us(stack):
    problems, companions = [], {}
    py = stack.python
    for n, pin in stack.pins.items():
        md = metadata(pin.name, str(stack.version(n)), py)
        spec = SpecifierSet(md["requires_python"])
        if not spec.contains(py, prereleases=True):
            problems.append(f"{pin} requires Python {spec}, its stack is Python {py}")
        reqs = requirements(md, pin.extras, py)
        problems += stack.conflicts(str(pin), reqs)
        if n == "torch":
            continue  # torch's own pins are its CUDA runtime (cuda-toolkit, nvidia-*, triton): NVIDIA's set
        for r in reqs:  # one level down: the exact pins the stack's wheels make themselves
            v = _pinned_version(r)
            if (
                v is not None
                and canonicalize_name(r.name) not in stack.pins
                and not r.name.startswith("transformer_engine")
            ):
                companions[(r.name, str(v))] = str(pin)
    for (name, version), parent in sorted(companions.items()):
        md = metadata(name, version, py)
        problems += stack.conflicts(f"{name}=={version} (required by {parent})", requirements(md, python=py))
    assert not problems, f"the gpu stack on Python {py} does not resolve:\n" + "\n".join(problems)


def test_transformer_engine_extras_and_cuda_major_match_torch(stack):
    te = stack.pins["transformer-engine"]
    md = metadata(te.name, str(stack.version("transformer-engine")), stack.python)
    cores = [
        r
        for r in requirements(md, te.extras, stack.python)
        if canonicalize_name(r.name).startswith("transformer-engine-")
    ]
    assert {canonicalize_name(r.name) for r in cores} >= {"transformer-engine-torch"}, cores
    for r in cores:  # the meta-package's extras pin TE packages of its own version
        assert r.specifier.contains(stack.version("transformer-engine")), r
    te_cuda = {
        int(m.group(1)) for r in cores if (m := re.fullmatch(r"transformer-engine-cu(\d+)", canonicalize_name(r.name)))
    }
    torch_md = metadata("torch", str(stack.version("torch")), stack.python)
    torch_cuda = set()
    for r in requirements(torch_md, python=stack.python):
        n = canonicalize_name(r.name)
        if n == "cuda-toolkit" and _pinned_version(r) is not None:
            torch_cuda.add(_pinned_version(r).major)
        elif m := re.fullmatch(r"nvidia-.*-cu(\d+)", n):
            torch_cuda.add(int(m.group(1)))
    assert len(torch_cuda) == 1, (
        f"torch {stack.version('torch')}: CUDA major not clear from its requirements {torch_cuda}"
    )
    assert te_cuda == torch_cuda, (
        f"transformer-engine extras {sorted(te.extras)} pull TE core for CUDA {te_cuda}, torch "
        f"{stack.version('torch')} is built for CUDA {torch_cuda}: use the core_cu{min(torch_cuda)} extra"
    )


def test_megatron_core_declares_our_transformer_engine(stack):
    """megatron-core names the TE it works with: 0.16.1 in its development extra (a version range),
    0.19 in its ``te`` extra (no version: the pin is then the README's choice, checked against the
    features the release tests for, see setup.py)."""
    md = metadata("megatron-core", str(stack.version("megatron-core")), stack.python)
    te = [
        r
        for extra in ("dev", "te")
        for r in requirements(md, (extra,), stack.python)
        if canonicalize_name(r.name) == "transformer-engine"
    ]
    assert te, "megatron-core's dev and te extras no longer name transformer-engine: check the TE pin by hand"
    pinned = stack.version("transformer-engine")
    assert all(r.specifier.contains(pinned, prereleases=True) for r in te), (
        f"megatron-core {stack.version('megatron-core')} declares {[str(r) for r in te]}, the gpu extra pins "
        f"{stack.pins['transformer-engine']}"
    )
    assert any(set(r.extras) <= set(stack.pins["transformer-engine"].extras) for r in te), (
        f"megatron-core asks for TE extras {[sorted(r.extras) for r in te]}, the gpu extra has "
        f"{sorted(stack.pins['transformer-engine'].extras)}"
    )


def test_each_python_gets_its_own_stack():
    """The primary stack (3.12) and the compatibility stack (3.11) pin the megatron-core that each
    Python can install; both share torch and sglang."""
    primary, compat = Stack("3.12"), Stack("3.11")
    assert primary.version("megatron-core") >= Version("0.19") > compat.version("megatron-core")
    assert primary.version("torch") == compat.version("torch")
    assert primary.version("sglang") == compat.version("sglang")


def test_the_conflict_check_catches_a_conflict(stack):
    """The check itself: a wheel requiring another torch, or a transformers outside our range, is reported."""
    bad = [Requirement("torch==2.13.0"), Requirement("transformers<4.50"), Requirement("numpy")]
    found = stack.conflicts("x", bad)
    assert any("torch==2.13.0" in p for p in found) and any("transformers<4.50" in p for p in found)
    assert len(found) == 2
