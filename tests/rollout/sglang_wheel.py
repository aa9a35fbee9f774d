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
            found[name] = textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))
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
    return {
        n: getattr(typing, n)
        for n in ("Any", "Callable", "Dict", "Iterator", "List", "Optional", "Set", "Tuple", "Union", "cast", "Literal")
    }


class _Struct:
    """Stand-in for ``msgspec.Struct`` (frozen keyword): a dataclass."""

    def __init_subclass__(cls, frozen: bool = False, kw_only: bool = False, array_like: bool = False, **kw):
        super().__init_subclass__(**kw)
        dataclasses.dataclass(frozen=frozen, kw_only=kw_only)(cls)


MSGSPEC = SimpleNamespace(
    Struct=_Struct,
    structs=SimpleNamespace(replace=dataclasses.replace, fields=dataclasses.fields),
    convert=lambda obj, typ: typ(**obj) if isinstance(obj, dict) else obj,
)


def serializer_namespace(src: WheelSource) -> dict:
    """sglang.srt.utils.common: MultiprocessingSerializer, SafeUnpickler and the payload
    normalisation the Engine and TokenizerManager apply."""
    names = [
        "MultiprocessingSerializer",
        "SerializedTensorPayload",
        "_looks_like_pickle_payload",
        "normalize_serialized_named_tensor_payload",
        "normalize_serialized_named_tensor_payloads",
        "_safe_load_torch_storage",
        "SafeUnpickler",
        "safe_pickle_loads",
    ]
    ns = dict(
        _typing_names(),
        io=io,
        pickle=pickle,
        binascii=binascii,
        torch=torch,
        ForkingPickler=ForkingPickler,
        pybase64=base64,
        __name__="sglang.srt.utils.common",
    )
    return run(extract(src, "sglang.srt.utils.common", names), ns, "sglang/srt/utils/common.py")


def parallel(tp_rank: int, tp_size: int) -> SimpleNamespace:
    return SimpleNamespace(
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_size=1,
        num_dp_ranks=1,
        dp_rank=None,
        attn_dp_size=1,
        pp_rank=0,
        pp_size=1,
        tp_group=SimpleNamespace(cpu_group=f"tp-cpu-group-{tp_rank}"),
    )


def session_manager_namespace(
    src: WheelSource, tp_rank: int, tp_size: int, constants, barrier, gather=None, io_ns=None
) -> dict:
    """sglang.srt.managers.scheduler_components.weight_updater: the scheduler's weight-update
    manager (session rule, fan-out to runners, release/resume by tag, the weight checker's
    request), per TP rank. ``gather(rank, out_list, obj)``: torch.distributed.all_gather_object
    over the TP ranks; ``io_ns``: :func:`check_weights_io_namespace` (its output classes)."""
    names = [
        "_parse_runner_selector",
        "_WeightUpdateSession",
        "SchedulerWeightUpdaterManager",
        "_export_static_state",
        "_import_static_state",
        "_merge_checksum_payloads",
    ]
    outputs = {}
    for n in (
        "BeginWeightUpdateReqOutput",
        "EndWeightUpdateReqOutput",
        "UpdateWeightsFromTensorReqOutput",
        "ReleaseMemoryOccupationReqOutput",
        "ResumeMemoryOccupationReqOutput",
        "CheckWeightsReqOutput",
    ):
        outputs[n] = type(n, (), {"__init__": lambda self, **kw: self.__dict__.update(kw)})
    if io_ns is not None:
        outputs.update(CheckWeightsReqOutput=io_ns["CheckWeightsReqOutput"], ChecksumInfo=io_ns["ChecksumInfo"])
    import hashlib
    import traceback

    m_wc = "sglang.srt.utils.weight_checker"
    overall_checksum = run(
        extract(src, m_wc, ["overall_checksum"]),
        dict(_typing_names(), hashlib=hashlib, __name__=m_wc),
        m_wc.replace(".", "/") + ".py",
    )["overall_checksum"]

    torch_shim = SimpleNamespace(
        distributed=SimpleNamespace(
            barrier=lambda *a, **k: barrier(tp_rank),
            get_world_size=lambda group=None: tp_size,
            all_gather_object=lambda out, obj, group=None: gather(tp_rank, out, obj),
        ),
        get_device_module=lambda *a: SimpleNamespace(synchronize=lambda: None),
        inference_mode=torch.inference_mode,
    )
    disagg = SimpleNamespace(NULL="null", DECODE="decode", PREFILL="prefill")
    ns = dict(
        _typing_names(),
        **outputs,
        dataclass=dataclasses.dataclass,
        field=dataclasses.field,
        contextmanager=contextlib.contextmanager,
        time=time,
        msgspec=MSGSPEC,
        torch=torch_shim,
        logger=logging.getLogger("sglang_wheel"),
        traceback=traceback,
        DisaggregationMode=disagg,
        overall_checksum=overall_checksum,
        get_parallel=lambda: parallel(tp_rank, tp_size),
        get_model=lambda: SimpleNamespace(weight_cache_mode="off"),
        GPU_MEMORY_ALL_TYPES=constants.GPU_MEMORY_ALL_TYPES,
        GPU_MEMORY_TYPE_CUDA_GRAPH=constants.GPU_MEMORY_TYPE_CUDA_GRAPH,
        GPU_MEMORY_TYPE_KV_CACHE=constants.GPU_MEMORY_TYPE_KV_CACHE,
        GPU_MEMORY_TYPE_WEIGHTS=constants.GPU_MEMORY_TYPE_WEIGHTS,
        __name__=__name__,
    )  # dataclasses with string annotations need a module in sys.modules
    module = "sglang.srt.managers.scheduler_components.weight_updater"
    return run(extract(src, module, names), ns, module.replace(".", "/") + ".py")


def runner_weight_updater_functions(src: WheelSource, tensor_bucket) -> dict:
    """The model runner's WeightUpdater methods on the flattened-bucket path
    (sglang.srt.model_executor.model_runner_components.weight_updater)."""
    module = "sglang.srt.model_executor.model_runner_components.weight_updater"
    names = ["update_weights_from_tensor", "_update_weights_from_flattened_bucket"]
    ns = dict(
        _typing_names(),
        torch=torch,
        LocalSerializedTensor=object,
        _unsupported_derived_weight_cache_error=lambda model: None,
        monkey_patch_torch_reductions=lambda: None,
        FlattenedTensorBucket=tensor_bucket.FlattenedTensorBucket,
        FlattenedTensorMetadata=tensor_bucket.FlattenedTensorMetadata,
        __name__=module,
    )
    out = run(extract(src, module, names, cls="WeightUpdater"), ns, module.replace(".", "/") + ".py")
    return {n: out[n] for n in names}


def deserialize_own_rank_function(src: WheelSource, serializer_ns: dict, tp_rank: int, tp_size: int):
    """sglang.srt.managers.tp_worker: each rank deserializes only its own payload."""
    module = "sglang.srt.managers.tp_worker"
    tree = src.tree(module)
    cls = next(
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef)
        and any(isinstance(m, ast.FunctionDef) and m.name == "deserialize_own_rank" for m in n.body)
    )
    ns = dict(
        monkey_patch_torch_reductions=lambda: None,
        MultiprocessingSerializer=serializer_ns["MultiprocessingSerializer"],
        get_parallel=lambda: parallel(tp_rank, tp_size),
        __name__=module,
    )
    return run(extract(src, module, ["deserialize_own_rank"], cls=cls), ns, module.replace(".", "/") + ".py")[
        "deserialize_own_rank"
    ]


def engine_serialize_function(src: WheelSource, serializer_ns: dict, tp_size: int):
    """sglang.srt.entrypoints.engine.Engine._serialize_tensors_per_rank."""
    module = "sglang.srt.entrypoints.engine"
    ns = dict(
        _typing_names(),
        normalize_serialized_named_tensor_payloads=serializer_ns["normalize_serialized_named_tensor_payloads"],
        SerializedTensorPayload=serializer_ns["SerializedTensorPayload"],
        MultiprocessingSerializer=serializer_ns["MultiprocessingSerializer"],
        get_parallel=lambda: parallel(0, tp_size),
        __name__=module,
    )
    return run(
        extract(src, module, ["_serialize_tensors_per_rank"], cls="Engine"), ns, module.replace(".", "/") + ".py"
    )["_serialize_tensors_per_rank"]


def merge_results_function(src: WheelSource):
    """sglang.srt.managers.communicator.FanOutCommunicator.merge_results."""
    module = "sglang.srt.managers.communicator"
    code = extract(src, module, ["merge_results"], cls="FanOutCommunicator")
    return run(code, {"staticmethod": lambda f: f, "__name__": module}, module.replace(".", "/") + ".py")[
        "merge_results"
    ]


def input_logprob_functions(src: WheelSource):
    """How SGLang turns a prefill's input logprobs into ``meta_info["input_token_logprobs"]``:
    the scheduler's ``_process_input_token_logprobs`` (``[None] + lp[:-1]``, ids clipped at the
    end of the vocabulary) and the tokenizer manager's ``detokenize_logprob_tokens``."""
    m1 = "sglang.srt.managers.scheduler_components.logprob_result_processor"
    p = run(
        extract(src, m1, ["_process_input_token_logprobs"], cls="SchedulerLogprobResultProcessor"),
        dict(_typing_names(), MIS_DELIMITER_TOKEN_ID=9999, __name__=m1),
        m1.replace(".", "/") + ".py",
    )
    m2 = "sglang.srt.managers.tokenizer_manager"
    d = run(
        extract(src, m2, ["detokenize_logprob_tokens"], cls="TokenizerManager"),
        dict(_typing_names(), __name__=m2),
        m2.replace(".", "/") + ".py",
    )
    return p["_process_input_token_logprobs"], d["detokenize_logprob_tokens"]


def sampling_params_class(src: WheelSource):
    """sglang.srt.sampling.sampling_params.SamplingParams (``__post_init__`` and ``verify``:
    how SGLang reads the sampling_params dicts we send); watermark support stubbed out."""
    module = "sglang.srt.sampling.sampling_params"
    names = [
        "_SAMPLING_EPS",
        "TOP_K_ALL",
        "REQUEST_REASONING_END_TOKEN_IDS_KEY",
        "MAX_REQUEST_REASONING_END_TOKEN_IDS",
        "get_request_reasoning_end_token_ids",
        "SamplingParams",
    ]
    import math
    import re

    ns = dict(
        _typing_names(),
        Sequence=typing.Sequence,
        msgspec=MSGSPEC,
        math=math,
        re=re,
        logging=logging,
        logger=logging.getLogger(module),
        CustomParamValue=typing.Any,
        WatermarkRequestConfig=typing.Any,
        normalize_watermark_request=lambda w: w,
        __name__=__name__,
    )
    return run(extract(src, module, names), ns, module.replace(".", "/") + ".py")["SamplingParams"]


# --------------------------------------------------------------------- weight checker ----
def check_weights_io_namespace(src: WheelSource) -> dict:
    """sglang.srt.managers.io_struct: CheckWeightsReqInput / CheckWeightsReqOutput and the wire
    ChecksumInfo / ParallelismInfo (msgspec structs, here dataclasses)."""
    module = "sglang.srt.managers.io_struct"

    class BaseReq(_Struct, kw_only=True):
        rid: typing.Optional[str] = None
        http_worker_ipc: typing.Optional[str] = None

    ns = dict(_typing_names(), msgspec=MSGSPEC, BaseReq=BaseReq, __name__=__name__)
    names = ["CheckWeightsReqInput", "ParallelismInfo", "ChecksumInfo", "CheckWeightsReqOutput"]
    return run(extract(src, module, names), ns, module.replace(".", "/") + ".py")


def weight_checker_namespace(src: WheelSource, tp_rank: int, tp_size: int) -> dict:
    """sglang.srt.utils.weight_checker (WeightChecker: snapshot / reset_tensors / compare /
    checksum) with its comparator and ``mm_utils.tensor_hash`` (its CPU path: sha256 of the
    bytes; the GPU path is a triton hash of the same bytes), for one TP rank."""
    import hashlib

    from pydantic import BaseModel, ConfigDict

    m_cmp = "sglang.srt.utils.weight_checker_comparator"
    quant = {
        n: type(n, (), {})
        for n in ("Fp8LinearMethod", "Fp8MoEMethod", "ModelOptFp4LinearMethod", "ModelOptNvFp4FusedMoEMethod")
    }
    cmp = run(
        extract(
            src,
            m_cmp,
            [
                "CHUNK_NUMEL",
                "CompareResult",
                "ComparableWeight",
                "RawComparable",
                "compare_weights",
                "select_comparable_weight",
            ],
        ),
        dict(
            _typing_names(),
            NamedTuple=typing.NamedTuple,
            Iterable=typing.Iterable,
            torch=torch,
            **quant,
            __name__=m_cmp,
        ),
        m_cmp.replace(".", "/") + ".py",
    )
    m_mm = "sglang.srt.managers.mm_utils"

    def gpu_tensor_hash(t):
        raise AssertionError("CPU tensors take tensor_hash's CPU path")

    mm = run(
        extract(src, m_mm, ["tensor_hash"]),
        dict(
            hashlib=hashlib,
            torch=torch,
            gpu_tensor_hash=gpu_tensor_hash,
            flatten_nested_list=lambda x: x,
            __name__=m_mm,
        ),
        m_mm.replace(".", "/") + ".py",
    )
    module = "sglang.srt.utils.weight_checker"
    names = [
        "_StrictBaseModel",
        "ParallelismInfo",
        "ChecksumInfo",
        "CheckEntry",
        "QuantizedWeight",
        "_NON_PERSISTENT_BUFFER_PATTERNS",
        "_is_non_persistent_buffer_name",
        "_is_skip_weight_check",
        "overall_checksum",
        "_padded",
        "_ArenaAllocator",
        "WeightChecker",
        "_hash_tensor",
        "_check_tensors",
        "_random_like",
        "_build_quantized_set",
        "_build_check_entries",
    ]
    ns = dict(
        _typing_names(),
        NamedTuple=typing.NamedTuple,
        Iterable=typing.Iterable,
        hashlib=hashlib,
        logging=logging,
        logger=logging.getLogger("sglang_wheel"),
        time=time,
        torch=torch,
        dist=torch.distributed,
        BaseModel=BaseModel,
        ConfigDict=ConfigDict,
        tensor_hash=mm["tensor_hash"],
        alloc_mmap=lambda shape, dtype: torch.empty(shape, dtype=dtype),
        current_platform=SimpleNamespace(synchronize=lambda: None),
        get_parallel=lambda: parallel(tp_rank, tp_size),
        __name__=module,
        **{
            k: cmp[k]
            for k in ("CHUNK_NUMEL", "ComparableWeight", "RawComparable", "compare_weights", "select_comparable_weight")
        },
    )
    # evaluated annotations (pydantic reads them at class creation), as the module itself does
    exec(compile(extract(src, module, names), module.replace(".", "/") + ".py", "exec", dont_inherit=True), ns)
    return ns


def model_runner_check_weights(src: WheelSource):
    """sglang.srt.model_executor.model_runner.ModelRunner.check_weights (hands the request to
    its WeightChecker)."""
    module = "sglang.srt.model_executor.model_runner"
    return run(
        extract(src, module, ["check_weights"], cls="ModelRunner"),
        dict(_typing_names(), __name__=module),
        module.replace(".", "/") + ".py",
    )["check_weights"]


def tokenizer_check_weights(src: WheelSource):
    """sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.check_weights (async):
    fans the request out through ``self.check_weights_communicator`` and merges the answers
    into (success, message, per-rank checksums, per-engine checksum)."""
    import hashlib

    module = "sglang.srt.managers.tokenizer_control_mixin"
    b = run(
        extract(src, "sglang.srt.utils.msgspec_utils", ["msgspec_to_builtins"]),
        dict(msgspec=MSGSPEC, dataclasses=dataclasses, Any=typing.Any, __name__=__name__),
        "sglang/srt/utils/msgspec_utils.py",
    )
    ns = dict(
        _typing_names(),
        hashlib=hashlib,
        msgspec_to_builtins=b["msgspec_to_builtins"],
        FanOutCommunicator=SimpleNamespace(merge_results=merge_results_function(src)),
        __name__=module,
    )
    return run(
        extract(src, module, ["check_weights"], cls="TokenizerControlMixin"), ns, module.replace(".", "/") + ".py"
    )["check_weights"]
