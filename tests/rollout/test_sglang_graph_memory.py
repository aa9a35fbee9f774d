"""The "cuda_graph" memory tag frees SGLang's CUDA graphs: what the adapter's launch sets, run
through the pinned sglang 0.5.23's own code on the CPU.

sglang captures its decode graphs under the memory saver (so that releasing the tag frees
them) only when ``SGLANG_MEMORY_SAVER_CUDA_GRAPH`` is set in the scheduler's environment
(``FullCudaGraphBackend.__init__``), and its default prefill graph backend on CUDA
("breakable") refuses that mode (``BreakableCudaGraphBackend.__init__`` raises). The tests
launch ``SGLangEngine`` against a recording stand-in for ``sglang.Engine`` and feed what it
saw (environment, server args) to those constructors and to ``parse_cuda_graph_config``, cut
out of the wheel (tests/rollout/sglang_wheel.py) and run unmodified.
"""

from __future__ import annotations

import ast
import logging
import os
import sys
import types
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional

import pytest

from megatron_dapo.hybrid.phases import AFTER_SYNC_TAGS
from megatron_dapo.rollout import sglang_engine as se
from megatron_dapo.rollout.base import CUDA_GRAPH, MEMORY_TAGS
from tests.rollout import sglang_wheel as sw

FULL = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend"
BREAKABLE = "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend"
GRAPH_CONFIG = "sglang.srt.model_executor.cuda_graph_config"
GRAPH_HOOK = "sglang.srt.arg_groups.cuda_graph_hook"


@pytest.fixture(scope="module")
def src():
    return sw.wheel()


class RecordingEngine:
    """``sglang.Engine`` that records its kwargs and the graph-saver variable at launch
    (SGLang's scheduler processes inherit the launching process's environment then)."""

    launches: List[dict] = []

    def __init__(self, **kwargs):
        RecordingEngine.launches.append(
            {"kwargs": kwargs, "env": {se.GRAPH_SAVER_ENV: os.environ.get(se.GRAPH_SAVER_ENV)}}
        )


@pytest.fixture
def fake_sglang(monkeypatch):
    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)

    mod("sglang", Engine=RecordingEngine)
    for name in ("sglang.srt", "sglang.srt.utils", "sglang.srt.weight_sync"):
        mod(name)
    mod(
        "sglang.srt.utils.common",
        MultiprocessingSerializer=types.SimpleNamespace(serialize=lambda obj, output_str=False: obj),
    )
    mod("sglang.srt.utils.patch_torch", monkey_patch_torch_reductions=lambda: None)
    mod("sglang.srt.weight_sync.tensor_bucket", FlattenedTensorMetadata=object)
    monkeypatch.delenv(se.RAW_LOGPROB_ENV, raising=False)
    monkeypatch.delenv(se.GRAPH_SAVER_ENV, raising=False)
    monkeypatch.setattr(RecordingEngine, "launches", [])
    return RecordingEngine


def launch(**kw) -> dict:
    se.SGLangEngine("/no/such/model", device="cuda", tp_size=4, **kw)
    return RecordingEngine.launches[-1]


# ------------------------------------------------------------- the wheel's code ----
class _Adapter:
    """TorchMemorySaverAdapter.create(enable=...): what the backends ask of it."""

    def __init__(self, enable):
        self.enabled = bool(enable)

    @classmethod
    def create(cls, enable):
        return cls(enable)


def _backend_init(src, module: str, cls: str, env: Dict[str, Optional[str]], monkeypatch) -> Callable:
    """The wheel's ``<cls>.__init__`` with the wheel's own ``get_bool_env_var`` reading ``env``."""
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    ns = {
        "os": os,
        "logger": logging.getLogger("sglang-wheel"),
        "_warned_bool_env_var_keys": set(),
        "Dict": Dict,
        "Any": Any,
        "Optional": Optional,
        "TorchMemorySaverAdapter": _Adapter,
        "get_parallel": lambda: types.SimpleNamespace(tp_group=None),
        "GraphPoolPrecarve": object,
    }
    sw.run(sw.extract(src, "sglang.srt.utils.common", ["get_bool_env_var"]), ns, "sglang/srt/utils/common.py")
    sw.run(sw.extract(src, module, ["__init__"], cls=cls), ns, src.module_file(module))
    return ns["__init__"]


def graph_saver_in_backend(src, module, cls, env, monkeypatch):
    """Whether the wheel's backend ``cls`` captures its graphs under the memory saver when
    the engine was launched with memory saver on and ``env``."""
    init = _backend_init(src, module, cls, env, monkeypatch)
    runner = types.SimpleNamespace(device_module=None, model_runner=None)
    obj = types.SimpleNamespace()
    init(obj, runner, enable_memory_saver=True)
    return obj._memory_saver_adapter.enabled


def _graph_field_defaults(src) -> dict:
    """Defaults of the ServerArgs CUDA-graph fields (sglang/srt/arg_groups/fields/exec_.py)."""
    out = {}
    for node in ast.walk(src.tree_of_file("sglang/srt/arg_groups/fields/exec_.py")):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if "cuda_graph" in node.target.id:
                out[node.target.id] = ast.literal_eval(node.value)
    assert "cuda_graph_backend_prefill" in out and "disable_cuda_graph" in out, sorted(out)
    return out


def resolved_graph_config(src, engine_kwargs: dict):
    """The wheel's ``parse_cuda_graph_config`` on ServerArgs made of ``engine_kwargs``; the
    prefill default is the one on CUDA (``default_prefill_backend``: breakable)."""
    ns: Dict[str, Any] = {
        "dataclass": dataclass,
        "field": field,
        "replace": replace,
        "dataclasses": __import__("dataclasses"),
        "Optional": Optional,
        "List": List,
        "Dict": Dict,
        "Any": Any,
        "default_prefill_backend": lambda: "breakable",
    }
    sw.run(
        sw.extract(
            src,
            GRAPH_CONFIG,
            ["Phase", "Backend", "PhaseConfig", "CudaGraphConfig", "default_cuda_graph_config", "_diff_phase"],
        ),
        ns,
        src.module_file(GRAPH_CONFIG),
    )
    fields = _graph_field_defaults(src)
    args = types.SimpleNamespace(**{k: engine_kwargs.get(k, v) for k, v in fields.items()})
    declared = {}
    ns.update(resolving_view=lambda sa: sa, declare_resolution=lambda sa, who, **kw: declared.update(kw))
    sw.run(sw.extract(src, GRAPH_HOOK, ["parse_cuda_graph_config"]), ns, src.module_file(GRAPH_HOOK))
    ns["parse_cuda_graph_config"](args)
    return declared["cuda_graph_config"]


# ------------------------------------------------------------------------- tests ----
def test_launch_captures_decode_graphs_under_the_memory_saver(src, fake_sglang, monkeypatch):
    got = launch(enable_memory_saver=True)
    assert got["env"] == {se.GRAPH_SAVER_ENV: "1"}
    assert got["kwargs"]["cuda_graph_backend_prefill"] == "disabled"
    # the wheel's decode backend, in the environment the engine was launched with
    assert graph_saver_in_backend(src, FULL, "FullCudaGraphBackend", got["env"], monkeypatch)
    # without the variable (the launch before this fix) the tag covers nothing
    assert not graph_saver_in_backend(src, FULL, "FullCudaGraphBackend", {se.GRAPH_SAVER_ENV: None}, monkeypatch)


def test_launch_disables_the_prefill_graph_the_saver_refuses(src, fake_sglang, monkeypatch):
    got = launch(enable_memory_saver=True)
    cfg = resolved_graph_config(src, got["kwargs"])
    assert (cfg.decode.backend, cfg.prefill.backend) == ("full", "disabled")
    # why: the default prefill backend on CUDA is breakable, which refuses the saver mode
    assert resolved_graph_config(src, {}).prefill.backend == "breakable"
    with pytest.raises(NotImplementedError, match="not compatible with memory saver"):
        graph_saver_in_backend(src, BREAKABLE, "BreakableCudaGraphBackend", got["env"], monkeypatch)


def test_no_memory_saver_or_no_graphs_changes_nothing(src, fake_sglang):
    for kw in ({"enable_memory_saver": False}, {"enable_memory_saver": True, "disable_cuda_graph": True}):
        got = launch(**kw)
        assert got["env"] == {se.GRAPH_SAVER_ENV: None} and "cuda_graph_backend_prefill" not in got["kwargs"], kw
        assert resolved_graph_config(src, got["kwargs"]).prefill.backend == (
            "disabled" if kw.get("disable_cuda_graph") else "breakable"
        )


def test_conflicting_graph_saver_env_is_refused(fake_sglang, monkeypatch):
    monkeypatch.setenv(se.GRAPH_SAVER_ENV, "0")
    with pytest.raises(RuntimeError, match=f"{se.GRAPH_SAVER_ENV}='0' conflicts"):
        launch(enable_memory_saver=True)
    assert RecordingEngine.launches == []


def test_phase_order_releases_only_what_the_launch_makes_releasable(src, fake_sglang, monkeypatch):
    # HybridStep releases every tag and resumes all but the weights after the sync; the
    # cuda_graph tag among them frees memory only because the launch captures under the saver.
    assert CUDA_GRAPH in MEMORY_TAGS and CUDA_GRAPH in AFTER_SYNC_TAGS
    env, args = se.graph_saver_launch(enable_memory_saver=True, disable_cuda_graph=False)
    assert args == {"cuda_graph_backend_prefill": "disabled"}
    assert graph_saver_in_backend(src, FULL, "FullCudaGraphBackend", env, monkeypatch)
    assert set(se.build_engine_kwargs("/m", enable_memory_saver=True)) <= set(se.USED_API["server_args"])
