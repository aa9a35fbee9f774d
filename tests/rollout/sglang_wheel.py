"""Run pieces of the pinned sglang wheel's own code on the CPU, without installing sglang.

sglang 0.5.23 does not import here (it pins torch 2.14.1 and needs CUDA-only packages), so
each piece is cut out of the wheel's source with ``ast`` (whole top-level functions and
classes, unmodified) and executed in a namespace that provides the names it uses: the real
ones where they import on the CPU (torch, pickle, the wheel's own ``tensor_bucket`` and
``constants`` modules), small stand-ins otherwise (``pybase64`` -> ``base64``, ``msgspec.Struct``
-> a frozen dataclass, ``torch.distributed.barrier`` -> no-op, io_struct request/response
classes -> plain records). Nothing is installed into sys.modules except through
``register_modules`` (tests do it with ``monkeypatch`` so it is undone).

Used by tests/rollout/test_sglang_protocol.py.
"""

from __future__ import annotations

import __future__
import ast
import base64
import binascii
import contextlib
import dataclasses
import io
import logging
import pickle
import textwrap
import time
import types
import typing
from multiprocessing.reduction import ForkingPickler
from types import SimpleNamespace

import torch

from tests.rollout.test_sglang_api import WheelSource, wheel_path

_FLAGS = __future__.annotations.compiler_flag


def wheel() -> WheelSource:
    return WheelSource(wheel_path())


def extract(src: WheelSource, module: str, names, cls: str = None) -> str:
    """Source of the top-level definitions ``names`` of ``module`` (or of class ``cls``'s
    methods), decorators included, in the order asked, unmodified (dedented). Fails naming
    what the wheel no longer has."""
    body = src.cls(module, cls).body if cls else src.tree(module).body
    lines = src.zf.read(src.module_file(module)).decode("utf-8").splitlines()
    found = {}
    for node in body:
        name = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        if name in names:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            found[name] = textwrap.dedent("\n".join(lines[first - 1:node.end_lineno]))
    missing = [n for n in names if n not in found]
    if missing:
        raise AssertionError(f"{module}{'.' + cls if cls else ''} has no {missing} in the pinned wheel")
    return "\n\n".join(found[n] for n in names) + "\n"


def run(code: str, namespace: dict, filename: str) -> dict:
    exec(compile(code, filename, "exec", flags=_FLAGS, dont_inherit=True), namespace)
    return namespace


def exec_module(src: WheelSource, dotted: str) -> types.ModuleType:
    """Execute a whole wheel module (only for modules that import nothing but torch/stdlib);
    the caller registers it in sys.modules (before pickling its classes)."""
    mod = types.ModuleType(dotted)
    mod.__file__ = src.module_file(dotted)
    code = src.zf.read(mod.__file__).decode("utf-8")
    exec(compile(code, mod.__file__, "exec", dont_inherit=True), mod.__dict__)
    return mod


def _typing_names() -> dict:
    return {n: getattr(typing, n) for n in ("Any", "Callable", "Dict", "Iterator", "List", "Optional",
                                             "Set", "Tuple", "Union", "cast", "Literal")}


class _Struct:
    """Stand-in for ``msgspec.Struct`` (frozen keyword): a dataclass."""

    def __init_subclass__(cls, frozen: bool = False, kw_only: bool = False, array_like: bool = False, **kw):
        super().__init_subclass__(**kw)
        dataclasses.dataclass(frozen=frozen, kw_only=kw_only)(cls)


MSGSPEC = SimpleNamespace(Struct=_Struct, structs=SimpleNamespace(replace=dataclasses.replace),
                          convert=lambda obj, typ: obj)


def serializer_namespace(src: WheelSource) -> dict:
    """sglang.srt.utils.common: MultiprocessingSerializer, SafeUnpickler and the payload
    normalisation the Engine and TokenizerManager apply."""
    names = ["MultiprocessingSerializer", "SerializedTensorPayload", "_looks_like_pickle_payload",
             "normalize_serialized_named_tensor_payload", "normalize_serialized_named_tensor_payloads",
             "_safe_load_torch_storage", "SafeUnpickler", "safe_pickle_loads"]
    ns = dict(_typing_names(), io=io, pickle=pickle, binascii=binascii, torch=torch,
              ForkingPickler=ForkingPickler, pybase64=base64, __name__="sglang.srt.utils.common")
    return run(extract(src, "sglang.srt.utils.common", names), ns, "sglang/srt/utils/common.py")


def parallel(tp_rank: int, tp_size: int) -> SimpleNamespace:
    return SimpleNamespace(tp_rank=tp_rank, tp_size=tp_size, dp_size=1, num_dp_ranks=1,
                           tp_group=SimpleNamespace(cpu_group=f"tp-cpu-group-{tp_rank}"))


def session_manager_namespace(src: WheelSource, tp_rank: int, tp_size: int, constants, barrier) -> dict:
    """sglang.srt.managers.scheduler_components.weight_updater: the scheduler's weight-update
    manager (session rule, fan-out to runners, release/resume by tag), per TP rank."""
    names = ["_parse_runner_selector", "_WeightUpdateSession", "SchedulerWeightUpdaterManager",
             "_export_static_state", "_import_static_state"]
    outputs = {}
    for n in ("BeginWeightUpdateReqOutput", "EndWeightUpdateReqOutput", "UpdateWeightsFromTensorReqOutput",
              "ReleaseMemoryOccupationReqOutput", "ResumeMemoryOccupationReqOutput"):
        outputs[n] = type(n, (), {"__init__": lambda self, **kw: self.__dict__.update(kw)})
    torch_shim = SimpleNamespace(
        distributed=SimpleNamespace(barrier=lambda *a, **k: barrier(tp_rank)),
        get_device_module=lambda *a: SimpleNamespace(synchronize=lambda: None),
        inference_mode=torch.inference_mode,
    )
    disagg = SimpleNamespace(NULL="null", DECODE="decode", PREFILL="prefill")
    ns = dict(_typing_names(), **outputs, dataclass=dataclasses.dataclass, field=dataclasses.field,
              contextmanager=contextlib.contextmanager, time=time, msgspec=MSGSPEC, torch=torch_shim,
              logger=logging.getLogger("sglang_wheel"), traceback=None, DisaggregationMode=disagg,
              get_parallel=lambda: parallel(tp_rank, tp_size),
              get_model=lambda: SimpleNamespace(weight_cache_mode="off"),
              GPU_MEMORY_ALL_TYPES=constants.GPU_MEMORY_ALL_TYPES,
              GPU_MEMORY_TYPE_CUDA_GRAPH=constants.GPU_MEMORY_TYPE_CUDA_GRAPH,
              GPU_MEMORY_TYPE_KV_CACHE=constants.GPU_MEMORY_TYPE_KV_CACHE,
              GPU_MEMORY_TYPE_WEIGHTS=constants.GPU_MEMORY_TYPE_WEIGHTS,
              __name__=__name__)  # dataclasses with string annotations need a module in sys.modules
    module = "sglang.srt.managers.scheduler_components.weight_updater"
    return run(extract(src, module, names), ns, module.replace(".", "/") + ".py")


def runner_weight_updater_functions(src: WheelSource, tensor_bucket) -> dict:
    """The model runner's WeightUpdater methods on the flattened-bucket path
    (sglang.srt.model_executor.model_runner_components.weight_updater)."""
    module = "sglang.srt.model_executor.model_runner_components.weight_updater"
    names = ["update_weights_from_tensor", "_update_weights_from_flattened_bucket"]
    ns = dict(_typing_names(), torch=torch, LocalSerializedTensor=object,
              _unsupported_derived_weight_cache_error=lambda model: None,
              monkey_patch_torch_reductions=lambda: None,
              FlattenedTensorBucket=tensor_bucket.FlattenedTensorBucket,
              FlattenedTensorMetadata=tensor_bucket.FlattenedTensorMetadata,
              __name__=module)
    out = run(extract(src, module, names, cls="WeightUpdater"), ns, module.replace(".", "/") + ".py")
    return {n: out[n] for n in names}


def deserialize_own_rank_function(src: WheelSource, serializer_ns: dict, tp_rank: int, tp_size: int):
    """sglang.srt.managers.tp_worker: each rank deserializes only its own payload."""
    module = "sglang.srt.managers.tp_worker"
    tree = src.tree(module)
    cls = next(n.name for n in tree.body if isinstance(n, ast.ClassDef)
               and any(isinstance(m, ast.FunctionDef) and m.name == "deserialize_own_rank" for m in n.body))
    ns = dict(monkey_patch_torch_reductions=lambda: None,
              MultiprocessingSerializer=serializer_ns["MultiprocessingSerializer"],
              get_parallel=lambda: parallel(tp_rank, tp_size), __name__=module)
    return run(extract(src, module, ["deserialize_own_rank"], cls=cls), ns,
               module.replace(".", "/") + ".py")["deserialize_own_rank"]


def engine_serialize_function(src: WheelSource, serializer_ns: dict, tp_size: int):
    """sglang.srt.entrypoints.engine.Engine._serialize_tensors_per_rank."""
    module = "sglang.srt.entrypoints.engine"
    ns = dict(_typing_names(), normalize_serialized_named_tensor_payloads=serializer_ns[
        "normalize_serialized_named_tensor_payloads"],
        SerializedTensorPayload=serializer_ns["SerializedTensorPayload"],
        MultiprocessingSerializer=serializer_ns["MultiprocessingSerializer"],
        get_parallel=lambda: parallel(0, tp_size), __name__=module)
    return run(extract(src, module, ["_serialize_tensors_per_rank"], cls="Engine"), ns,
               module.replace(".", "/") + ".py")["_serialize_tensors_per_rank"]


def merge_results_function(src: WheelSource):
    """sglang.srt.managers.communicator.FanOutCommunicator.merge_results."""
    module = "sglang.srt.managers.communicator"
    code = extract(src, module, ["merge_results"], cls="FanOutCommunicator")
    return run(code, {"staticmethod": lambda f: f, "__name__": module},
               module.replace(".", "/") + ".py")["merge_results"]


def input_logprob_functions(src: WheelSource):
    """How SGLang turns a prefill's input logprobs into ``meta_info["input_token_logprobs"]``:
    the scheduler's ``_process_input_token_logprobs`` (``[None] + lp[:-1]``, ids clipped at the
    end of the vocabulary) and the tokenizer manager's ``detokenize_logprob_tokens``."""
    m1 = "sglang.srt.managers.scheduler_components.logprob_result_processor"
    p = run(extract(src, m1, ["_process_input_token_logprobs"], cls="SchedulerLogprobResultProcessor"),
            dict(_typing_names(), MIS_DELIMITER_TOKEN_ID=9999, __name__=m1), m1.replace(".", "/") + ".py")
    m2 = "sglang.srt.managers.tokenizer_manager"
    d = run(extract(src, m2, ["detokenize_logprob_tokens"], cls="TokenizerManager"),
            dict(_typing_names(), __name__=m2), m2.replace(".", "/") + ".py")
    return p["_process_input_token_logprobs"], d["detokenize_logprob_tokens"]


def sampling_params_class(src: WheelSource):
    """sglang.srt.sampling.sampling_params.SamplingParams (``__post_init__`` and ``verify``:
    how SGLang reads the sampling_params dicts we send); watermark support stubbed out."""
    module = "sglang.srt.sampling.sampling_params"
    names = ["_SAMPLING_EPS", "TOP_K_ALL", "REQUEST_REASONING_END_TOKEN_IDS_KEY",
             "MAX_REQUEST_REASONING_END_TOKEN_IDS", "get_request_reasoning_end_token_ids", "SamplingParams"]
    import math
    import re

    ns = dict(_typing_names(), Sequence=typing.Sequence, msgspec=MSGSPEC, math=math, re=re,
              logging=logging, logger=logging.getLogger(module), CustomParamValue=typing.Any,
              WatermarkRequestConfig=typing.Any, normalize_watermark_request=lambda w: w,
              __name__=__name__)
    return run(extract(src, module, names), ns, module.replace(".", "/") + ".py")["SamplingParams"]
