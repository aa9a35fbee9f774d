"""API conformance of SGLangEngine against the pinned sglang release.

The wheel of ``sglang==SGLANG_VERSION`` is fetched once with ``pip download --no-deps`` into
``$MEGATRON_DAPO_SGLANG_CACHE`` (default ``~/.cache/megatron_dapo/sglang-<version>/``) and
reused; its sources are read with ``zipfile`` + ``ast``; sglang is never imported. If the
wheel is neither cached nor downloadable the test FAILS (an unchecked adapter is not a pass).

Everything checked comes from ``USED_API`` in megatron_dapo/rollout/sglang_api.py, and a
second test parses the adapter itself (megatron_dapo/rollout/sglang_engine.py and the
sglang_*.py modules it is split into) to make sure every SGLang call/import it makes is
listed there.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest

from megatron_dapo.rollout import sglang_engine
from megatron_dapo.rollout.sglang_engine import SGLANG_VERSION, USED_API

CACHE_DIR = Path(
    os.environ.get("MEGATRON_DAPO_SGLANG_CACHE")
    or Path.home() / ".cache" / "megatron_dapo" / f"sglang-{SGLANG_VERSION}"
)


def _find_wheel():
    wheels = sorted(CACHE_DIR.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    return wheels[0] if wheels else None


@lru_cache(maxsize=1)
def wheel_path() -> Path:
    whl = _find_wheel()
    if whl is not None:
        return whl
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Explicit target so any host (other Python, other OS) fetches the same Linux/CPython 3.11
    # wheel; the sources we read are the same in every wheel of a release.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--platform",
        "manylinux_2_34_x86_64",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        f"sglang=={SGLANG_VERSION}",
        "-d",
        str(CACHE_DIR),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        err = proc.stdout[-2000:] + proc.stderr[-2000:]
    except subprocess.TimeoutExpired as e:
        err = f"timed out: {e}"
    whl = _find_wheel()
    if whl is None:
        pytest.fail(
            f"cannot check the SGLang adapter: no cached wheel of sglang=={SGLANG_VERSION} in "
            f"{CACHE_DIR} and `{' '.join(cmd)}` failed:\n{err}\n"
            "Fetch it once on a machine with network access (same command) or point "
            "MEGATRON_DAPO_SGLANG_CACHE at a directory holding the wheel."
        )
    return whl


class WheelSource:
    def __init__(self, path: Path):
        self.zf = zipfile.ZipFile(path)
        self.names = set(self.zf.namelist())
        self._trees = {}

    def module_file(self, dotted: str) -> str:
        base = dotted.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.names:
                return cand
        raise AssertionError(f"module {dotted} not found in sglang=={SGLANG_VERSION} wheel")

    def tree(self, dotted: str) -> ast.Module:
        if dotted not in self._trees:
            f = self.module_file(dotted)
            self._trees[dotted] = ast.parse(self.zf.read(f).decode("utf-8"), filename=f)
        return self._trees[dotted]

    def tree_of_file(self, name: str) -> ast.Module:
        return ast.parse(self.zf.read(name).decode("utf-8"), filename=name)

    def cls(self, dotted: str, name: str) -> ast.ClassDef:
        for node in self.tree(dotted).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        raise AssertionError(f"class {name} not found in {dotted} (sglang=={SGLANG_VERSION})")


@pytest.fixture(scope="module")
def src() -> WheelSource:
    return WheelSource(wheel_path())


def _func(src: WheelSource, module: str, qualname: str):
    parts = qualname.split(".")
    body = src.tree(module).body
    if len(parts) == 2:
        body = src.cls(module, parts[0]).body
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == parts[-1]:
            return node
    raise AssertionError(f"{module}.{qualname} not found in sglang=={SGLANG_VERSION}")


def _param_names(fn) -> set:
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def _annotated_fields(cls: ast.ClassDef) -> set:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _all_identifiers_and_strings(tree) -> set:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
    return out


def _defined_names(tree: ast.Module) -> set:
    out = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Assign):
            out.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
    return out


def test_wheel_is_the_pinned_version(src):
    metas = [n for n in src.names if n.endswith(".dist-info/METADATA")]
    assert metas, "no METADATA in the wheel"
    text = src.zf.read(metas[0]).decode()
    assert f"\nVersion: {SGLANG_VERSION}\n" in text


@pytest.mark.parametrize("module,qualname,kwargs", USED_API["callables"], ids=lambda v: str(v))
def test_callables_and_kwargs(src, module, qualname, kwargs):
    fn = _func(src, module, qualname)
    missing = set(kwargs) - _param_names(fn)
    assert not missing, f"{module}.{qualname} has no parameters {sorted(missing)} in sglang=={SGLANG_VERSION}"


@pytest.mark.parametrize("module,cls,attr", USED_API["attributes"])
def test_instance_attributes(src, module, cls, attr):
    node = src.cls(module, cls)
    found = attr in _annotated_fields(node)
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        for t in targets:
            for e in ast.walk(t):
                if (
                    isinstance(e, ast.Attribute)
                    and e.attr == attr
                    and isinstance(e.value, ast.Name)
                    and e.value.id == "self"
                ):
                    found = True
                elif isinstance(e, ast.Name) and e.id == attr and n in node.body:
                    found = True
    assert found, f"{module}.{cls} never sets attribute {attr!r} in sglang=={SGLANG_VERSION}"


@pytest.mark.parametrize("module,name", USED_API["imports"])
def test_imports(src, module, name):
    assert name in _defined_names(src.tree(module)), f"{module} defines no {name!r}"


def test_engine_export_points_to_engine_class(src):
    text = ast.unparse(src.tree("sglang"))
    assert (
        'LazyImport("sglang.srt.entrypoints.engine", "Engine")' in text.replace("'", '"')
        or "from sglang.srt.entrypoints.engine import Engine" in text
    )
    src.cls("sglang.srt.entrypoints.engine", "Engine")


def _server_arg_fields(src) -> set:
    fields = set()
    try:
        fields |= _annotated_fields(src.cls("sglang.srt.server_args", "ServerArgs"))
    except AssertionError:
        pass
    # Since 0.5.2x ServerArgs is assembled from namespaces in sglang/srt/arg_groups/fields/.
    for name in sorted(src.names):
        if name.startswith("sglang/srt/arg_groups/fields/") and name.endswith(".py"):
            for node in src.tree_of_file(name).body:
                if isinstance(node, ast.ClassDef):
                    fields |= _annotated_fields(node)
    return fields


def test_server_args_fields(src):
    fields = _server_arg_fields(src)
    assert len(fields) > 50, "could not locate ServerArgs fields; the parser needs updating"
    missing = set(USED_API["server_args"]) - fields
    assert not missing, f"ServerArgs has no fields {sorted(missing)} in sglang=={SGLANG_VERSION}"


def test_engine_init_takes_server_args_kwargs(src):
    fn = _func(src, "sglang.srt.entrypoints.engine", "Engine.__init__")
    assert fn.args.kwarg is not None, "Engine.__init__ no longer takes **kwargs (ServerArgs fields)"


def test_build_engine_kwargs_only_uses_listed_server_args():
    kw = sglang_engine.build_engine_kwargs("/m", random_seed=1, context_length=8, port=1234, tokenizer_path="/t")
    assert set(kw) <= set(USED_API["server_args"])


def test_sampling_param_names(src):
    fields = _annotated_fields(src.cls("sglang.srt.sampling.sampling_params", "SamplingParams"))
    missing = set(USED_API["sampling_params"]) - fields
    assert not missing, f"SamplingParams has no {sorted(missing)} in sglang=={SGLANG_VERSION}"
    from megatron_dapo.rollout.base import SamplingParams

    d = sglang_engine.to_sglang_sampling_params(SamplingParams(stop=["x"], stop_token_ids=[1], seed=3), seed=3)
    assert set(d) <= set(USED_API["sampling_params"])


@pytest.mark.parametrize("module,cls,fields", USED_API["dataclass_fields"])
def test_dataclass_fields(src, module, cls, fields):
    have = _annotated_fields(src.cls(module, cls))
    assert set(fields) == have, f"{module}.{cls} fields are {sorted(have)}, adapter fills {sorted(fields)}"


@pytest.mark.parametrize("module,literals", USED_API["string_literals"])
def test_string_literals(src, module, literals):
    strings = {n.value for n in ast.walk(src.tree(module)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    missing = set(literals) - strings
    assert not missing, f"{module} no longer mentions {sorted(missing)} in sglang=={SGLANG_VERSION}"


@pytest.mark.parametrize("module,name,value", USED_API["constants"])
def test_constants(src, module, name, value):
    for n in src.tree(module).body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            assert isinstance(n.value, ast.Constant) and n.value.value == value, ast.unparse(n)
            return
    raise AssertionError(f"{module}.{name} not found")


def test_memory_tags_are_sglangs_full_set(src):
    # release_memory(MEMORY_TAGS) must free everything SGLang can release (GPU_MEMORY_ALL_TYPES)
    from megatron_dapo.rollout.base import MEMORY_TAGS

    values, all_types = {}, None
    for n in src.tree("sglang.srt.constants").body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            if isinstance(n.value, ast.Constant):
                values[n.targets[0].id] = n.value.value
            elif n.targets[0].id == "GPU_MEMORY_ALL_TYPES":
                all_types = [values[e.id] if isinstance(e, ast.Name) else e.value for e in n.value.elts]
    assert all_types, "sglang.srt.constants.GPU_MEMORY_ALL_TYPES not found"
    assert sorted(MEMORY_TAGS) == sorted(all_types)


@pytest.mark.parametrize("module,name", USED_API["env_vars"])
def test_env_vars(src, module, name):
    assert name in _all_identifiers_and_strings(src.tree(module)), f"{module} does not use {name}"


def test_flattened_bucket_metadata_is_unpicklable_by_sglang(src):
    # SGLang's SafeUnpickler admits an allow-list of globals; our payload pickles
    # FlattenedTensorMetadata and torch tensors/dtypes, which must be on it.
    strings = {
        n.value
        for n in ast.walk(src.tree("sglang.srt.utils.common"))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    for needed in (
        "sglang.srt.weight_sync.tensor_bucket",
        "FlattenedTensorMetadata",
        "torch.multiprocessing.reductions",
        "rebuild_cuda_tensor",
        "_rebuild_cuda_tensor_modified",
    ):
        assert needed in strings, needed


# ---------------------------------------------------------------------------------------
# The adapter itself: every SGLang use must be listed in USED_API.
def _adapter_files():
    """The adapter's modules: sglang_engine.py and its pieces (rollout/sglang_*.py), and the
    sender of weight broadcasts (hybrid/weight_broadcast.py)."""
    files = sorted(Path(sglang_engine.__file__).parent.glob("sglang_*.py"))
    assert Path(sglang_engine.__file__) in files and len(files) > 1, files
    return files + [Path(sglang_engine.__file__).parents[1] / "hybrid" / "weight_broadcast.py"]


def _adapter_tree():
    return ast.Module(body=[n for f in _adapter_files() for n in ast.parse(f.read_text()).body], type_ignores=[])


def test_every_engine_call_is_listed():
    listed = {q.split(".")[-1]: set(kw) for m, q, kw in USED_API["callables"] if q.startswith("Engine.")}
    tm_listed = {q.split(".")[-1]: set(kw) for m, q, kw in USED_API["callables"] if q.startswith("TokenizerManager.")}
    seen = set()
    for node in ast.walk(_adapter_tree()):
        # self._engine.<method>(...)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            v = node.func.value
            if isinstance(v, ast.Attribute) and v.attr == "_engine":
                meth = node.func.attr
                assert meth in listed, f"adapter calls Engine.{meth} which is not in USED_API"
                kws = {k.arg for k in node.keywords}
                assert kws <= listed[meth], f"Engine.{meth} called with {kws - listed[meth]} not in USED_API"
                seen.add(meth)
        # tm.<method> through functools.partial
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "functools.partial":
            target = node.args[0]
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "tm":
                assert target.attr in tm_listed
                assert {k.arg for k in node.keywords} <= tm_listed[target.attr]
        # self._engine.<attribute> reads
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "_engine":
            attrs = {a for _, _, a in USED_API["attributes"]} | set(listed)
            assert node.attr in attrs, f"adapter uses Engine.{node.attr} which is not in USED_API"
    assert seen, "found no Engine calls: the check is broken"


def test_every_sglang_import_is_listed():
    listed = set(map(tuple, USED_API["imports"]))
    found = set()
    for node in ast.walk(_adapter_tree()):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang"):
            for a in node.names:
                assert (node.module, a.name) in listed, f"import {node.module}.{a.name} not in USED_API"
                found.add((node.module, a.name))
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("sglang"):
                    assert a.name == "sglang"
    assert found


def test_sglang_calls_in_adapter_use_listed_kwargs():
    # sglang.Engine(**kwargs) gets build_engine_kwargs(...) whose keys are checked above;
    # MultiprocessingSerializer.serialize is called by serialize_bucket with output_str.
    text = Path(sglang_engine.__file__).read_text()
    assert "sglang.Engine(**kwargs)" in text
    from megatron_dapo.rollout import payload  # the one serializer (serialize_bucket lives there)

    assert "serializer(payload, output_str=True)" in Path(payload.__file__).read_text()
