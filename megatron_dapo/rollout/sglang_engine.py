"""SGLangEngine: a thin adapter around ``sglang.Engine`` (GPU), pinned to SGLANG_VERSION.

sglang is imported lazily (constructor / methods only). Everything that translates between
our types and SGLang's lives in pure functions below, exercised by CPU tests without sglang:
``build_engine_kwargs``, ``to_sglang_sampling_params``, ``build_generate_requests``,
``from_sglang_output``, ``group_outputs``, ``build_score_requests``,
``from_sglang_score_output``, ``checkpoint_weight_shapes``; the payload functions
(``flatten_bucket`` / ``serialize_bucket``) live in ``megatron_dapo.rollout.payload``, shared with HFEngine.

Every SGLang entry point, keyword argument, server-arg field, sampling-param name, meta_info
key, constant and environment variable the adapter uses is listed in ``USED_API``;
tests/rollout/test_sglang_api.py checks each against the source of the pinned wheel (read
with ``ast``, never imported). Add to USED_API whenever you add a use of SGLang here.

Logprobs: with ``logprobs_mode="processed"`` (default) ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is
left unset (an existing value must be falsy) and SGLang's sampler returns
``log_softmax(logits / T)`` at the request's temperature T, computed before top-k / top-p
truncation: the distribution the token was sampled from, which is what the trainer
recomputes (it divides its logits by the rollout temperature). With ``logprobs_mode="raw"``
the adapter sets the variable to 1 before SGLang starts its scheduler processes and gets
``log_softmax(logits)`` at temperature 1. Greedy requests are raw in either mode. The
variable is process-wide: all SGLangEngines started by one process must use the same mode.
``score`` uses prompt ("input") logprobs, which SGLang 0.5.23 always computes from raw logits
(the adapter asks at temperature 1.0 anyway).

Streaming (``submit`` / ``poll`` / ``abort_requests``): one ``Engine.async_generate`` task
per request (``rid`` given, see :func:`sglang_rid`) on the Engine's own event loop, which runs
only inside this adapter's calls (``poll`` drives it until a task ends; the scheduler process
generates meanwhile). ``abort_requests`` first lets every target reach the scheduler (a rid
not dispatched yet would miss its abort and run to the end), then sends
``TokenizerManager.abort_request(rid=...)`` for each, and waits for their answers: SGLang ends a
running request with finish reason "abort" and the output ids and logprobs so far, a queued
one with none.

Weight updates (0.5.23's protocol): ``update_weights_from_tensor`` is refused outside a
session, so the adapter opens one (``Engine.begin_weight_update``) explicitly or at the first
bucket and ends it (``Engine.end_weight_update``) in ``finish_weight_update``. The call
returns once SGLang has enqueued the copies, so a bucket's flat buffer is kept until the next
SGLang call has returned or the session ends, then freed (and the CUDA allocator's cache
emptied). Every control call's result is checked. See docs/rollout.md.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import json
import logging
import os
import pickle
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from megatron_dapo.rollout.base import (
    CUDA_GRAPH,
    KV_CACHE,
    LOGPROBS_MODES,
    WEIGHTS,
    EngineReleasedError,
    Finished,
    GenerationOutput,
    Request,
    RolloutEngine,
    SamplingParams,
    WeightUpdateError,
    check_request,
    check_weight_action,
    derive_seed,
)
from megatron_dapo.rollout.routing import decode_sglang_routed_experts
from megatron_dapo.rollout.payload import (  # noqa: F401  (re-exported: one serializer for every engine)
    BUCKET_ALIGN_BYTES,
    BucketEntry,
    default_serializer,
    flatten_bucket,
    reconstruct_bucket,
    serialize_bucket,
)

logger = logging.getLogger(__name__)

# The pinned release (a constant, not a data file, so a non-editable install has it too).
SGLANG_VERSION = "0.5.23"

INSTALL_HINT = (
    f"SGLangEngine needs sglang=={SGLANG_VERSION} (GPU only): pip install megatron-dapo[gpu] "
    f"(or pip install sglang=={SGLANG_VERSION})"
)

RAW_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"
#: Captures SGLang's CUDA graphs under its memory saver (tag "cuda_graph"); see graph_saver_launch.
GRAPH_SAVER_ENV = "SGLANG_MEMORY_SAVER_CUDA_GRAPH"
FLATTENED_BUCKET = "flattened_bucket"

# Single source of truth for what the adapter uses of SGLang. Checked against the pinned
# wheel by tests/rollout/test_sglang_api.py. Modules are dotted paths inside the wheel.
USED_API: Dict[str, Any] = {
    # (module, "Class.method" or "function", keyword arguments we pass by name)
    "callables": [
        ("sglang.srt.entrypoints.engine", "Engine.generate",
         ("input_ids", "sampling_params", "return_logprob", "logprob_start_len", "return_routed_experts")),
        ("sglang.srt.entrypoints.engine", "Engine.async_generate",
         ("input_ids", "sampling_params", "return_logprob", "rid", "return_routed_experts")),
        ("sglang.srt.entrypoints.engine", "Engine.update_weights_from_tensor",
         ("named_tensors", "load_format", "flush_cache")),
        ("sglang.srt.entrypoints.engine", "Engine.begin_weight_update", ()),
        ("sglang.srt.entrypoints.engine", "Engine.end_weight_update", ()),
        ("sglang.srt.entrypoints.engine", "Engine.release_memory_occupation", ("tags",)),
        ("sglang.srt.entrypoints.engine", "Engine.resume_memory_occupation", ("tags",)),
        ("sglang.srt.entrypoints.engine", "Engine.flush_cache", ()),
        ("sglang.srt.entrypoints.engine", "Engine.get_server_info", ()),
        ("sglang.srt.entrypoints.engine", "Engine.shutdown", ()),
        ("sglang.srt.managers.tokenizer_manager", "TokenizerManager.abort_request", ("rid", "abort_all")),
        # TokenizerManager's check_weights (the offline Engine has no method for it), called as
        # the Engine's own methods call the tokenizer manager: loop.run_until_complete(...)
        ("sglang.srt.managers.tokenizer_control_mixin", "TokenizerControlMixin.check_weights", ("obj", "request")),
        ("sglang.srt.utils.common", "MultiprocessingSerializer.serialize", ("obj", "output_str")),
        ("sglang.srt.utils.patch_torch", "monkey_patch_torch_reductions", ()),
    ],
    # attributes we read on instances: (module, class, attribute assigned in the class)
    "attributes": [
        ("sglang.srt.entrypoints.engine", "Engine", "tokenizer_manager"),
        ("sglang.srt.entrypoints.engine", "Engine", "loop"),
        # streaming: whether a request reached the scheduler (abort_requests waits for it)
        ("sglang.srt.managers.tokenizer_manager", "TokenizerManager", "rid_to_state"),
        ("sglang.srt.managers.tokenizer_manager", "ReqState", "dispatched"),
    ],
    # names we import: (module, name); "sglang" itself must export Engine
    "imports": [
        ("sglang", "Engine"),
        ("sglang.srt.utils.common", "MultiprocessingSerializer"),
        ("sglang.srt.utils.patch_torch", "monkey_patch_torch_reductions"),
        ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"),
        ("sglang.srt.managers.io_struct", "CheckWeightsReqInput"),
    ],
    # Engine(**kwargs) are ServerArgs fields
    "server_args": (
        "model_path", "tokenizer_path", "tp_size", "mem_fraction_static", "base_gpu_id",
        "enable_memory_saver", "dtype", "random_seed", "enable_deterministic_inference",
        "trust_remote_code", "log_level", "disable_cuda_graph", "context_length", "port",
        "load_format", "cuda_graph_backend_prefill",
        # routing replay: the scheduler captures each MoE layer's top-k (arg_groups/fields/exec_.py)
        "enable_return_routed_experts",
    ),
    # keys of the sampling_params dicts we send (sglang.srt.sampling.sampling_params.SamplingParams)
    "sampling_params": (
        "temperature", "top_p", "top_k", "max_new_tokens", "n", "stop", "stop_token_ids",
        "ignore_eos", "sampling_seed",
    ),
    # dataclass fields we fill: (module, class, fields)
    "dataclass_fields": [
        ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata",
         ("name", "shape", "dtype", "start_idx", "end_idx", "numel")),
        ("sglang.srt.managers.io_struct", "CheckWeightsReqInput",
         ("action", "allow_quant_error", "skip_tensor_list", "selector")),
        # one per rank in check_weights' answer (we read tp/dp/pp rank and size)
        ("sglang.srt.managers.io_struct", "ParallelismInfo",
         ("role", "tp_rank", "tp_size", "dp_rank", "dp_size", "pp_rank", "pp_size", "rank", "size")),
    ],
    # string literals that must appear in a module: the receiving side of our protocols
    "string_literals": [
        # load_format branch and the keys of the payload dict it reads
        ("sglang.srt.model_executor.model_runner_components.weight_updater",
         (FLATTENED_BUCKET, "flattened_tensor", "metadata")),
        # meta_info keys and finish_reason types we read
        ("sglang.srt.managers.tokenizer_manager",
         ("meta_info", "finish_reason", "output_token_logprobs", "input_token_logprobs", "output_ids",
          "routed_experts")),
        ("sglang.srt.managers.schedule_batch", ("type", "stop", "length", "abort")),
        # an aborted queued request is answered with finish type "abort" and its output ids
        ("sglang.srt.managers.tokenizer_manager", ("abort", "output_ids", "Abort in waiting queue")),
        # the session rule we follow (refusal messages of the scheduler's weight updater)
        ("sglang.srt.managers.scheduler_components.weight_updater",
         ("update_weights_from_tensor must run between begin_weight_update() and end_weight_update()",)),
        # load_format="dummy": random weights at launch, the first sync fills them
        ("sglang.srt.configs.load_config", ("dummy",)),
        # why the prefill graph is disabled when graphs are captured under the memory saver
        ("sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend",
         ("Breakable CUDA graph is not compatible with memory saver mode",)),
        ("sglang.srt.model_executor.cuda_graph_config", ("disabled",)),
        # the weight checker's actions we use (check_weights) and the answer's keys we read
        ("sglang.srt.utils.weight_checker", ("reset_tensors", "checksum")),
        ("sglang.srt.managers.scheduler_components.weight_updater",
         ("checksums", "parallelism_info")),
    ],
    # module-level constants: (module, name, value)
    "constants": [
        ("sglang.srt.constants", "GPU_MEMORY_TYPE_WEIGHTS", WEIGHTS),
        ("sglang.srt.constants", "GPU_MEMORY_TYPE_KV_CACHE", KV_CACHE),
        ("sglang.srt.constants", "GPU_MEMORY_TYPE_CUDA_GRAPH", CUDA_GRAPH),
    ],
    # environment variables we set: (module that declares/reads it, name)
    "env_vars": [
        ("sglang.srt.environ", RAW_LOGPROB_ENV),
        ("sglang.srt.layers.sampler", RAW_LOGPROB_ENV),
        ("sglang.srt.environ", GRAPH_SAVER_ENV),
        ("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend", GRAPH_SAVER_ENV),
    ],
}


# ------------------------------------------------------------------ pure functions ----
def build_engine_kwargs(
    model_path: str,
    *,
    tp_size: int = 1,
    mem_fraction_static: float = 0.5,
    base_gpu_id: int = 0,
    enable_memory_saver: bool = True,
    dtype: str = "bfloat16",
    random_seed: Optional[int] = None,
    enable_deterministic_inference: bool = False,
    trust_remote_code: bool = False,
    log_level: str = "error",
    disable_cuda_graph: bool = False,
    context_length: Optional[int] = None,
    port: Optional[int] = None,
    tokenizer_path: Optional[str] = None,
    load_format: Optional[str] = "dummy",
) -> Dict[str, Any]:
    """Keyword arguments of ``sglang.Engine`` (ServerArgs fields; all in USED_API).

    ``load_format="dummy"`` (default): SGLang starts with random weights instead of reading the
    checkpoint (the first weight sync fills them); ``tokenizer_path`` defaults to ``model_path``.
    """
    _, graph_args = graph_saver_launch(enable_memory_saver, disable_cuda_graph)
    kw: Dict[str, Any] = dict(
        model_path=str(model_path),
        tokenizer_path=str(tokenizer_path if tokenizer_path is not None else model_path),
        tp_size=int(tp_size),
        mem_fraction_static=float(mem_fraction_static),
        base_gpu_id=int(base_gpu_id),
        enable_memory_saver=bool(enable_memory_saver),
        dtype=dtype,
        trust_remote_code=bool(trust_remote_code),
        log_level=log_level,
        disable_cuda_graph=bool(disable_cuda_graph),
        enable_deterministic_inference=bool(enable_deterministic_inference),
        **graph_args,
    )
    for k, v in (("random_seed", random_seed), ("context_length", context_length),
                 ("port", port), ("load_format", load_format)):
        if v is not None:
            kw[k] = v
    return kw


def graph_saver_launch(enable_memory_saver: bool, disable_cuda_graph: bool) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """(environment, server args) that make ``release_memory(["cuda_graph"])`` free SGLang's
    CUDA graphs: with the memory saver on and graphs captured, ``SGLANG_MEMORY_SAVER_CUDA_GRAPH=1``
    and ``cuda_graph_backend_prefill="disabled"``; nothing otherwise.

    sglang 0.5.23 captures decode graphs under its memory saver (tag "cuda_graph", with a CPU
    backup of the graph pool: the graphs are kept, not re-captured, their pool is copied to
    host memory at release and back at resume) only when that variable is set
    (``FullCudaGraphBackend.__init__``); without it the tag frees nothing. Its default prefill
    graph backend on CUDA ("breakable") raises ``NotImplementedError`` under that variable
    (``BreakableCudaGraphBackend.__init__``), so the prefill phase runs eagerly. docs/rollout.md.
    """
    if not enable_memory_saver or disable_cuda_graph:
        return {}, {}
    return {GRAPH_SAVER_ENV: "1"}, {"cuda_graph_backend_prefill": "disabled"}


def to_sglang_sampling_params(params: SamplingParams, seed: Optional[int] = None) -> Dict[str, Any]:
    """One SGLang sampling_params dict for one sample (n is always 1: we expand n ourselves
    so that every sample gets its own seed and the output order is ours)."""
    params.validate()
    d: Dict[str, Any] = {
        "temperature": float(params.temperature),  # SGLang: 0 -> greedy (top_k=1)
        "top_p": float(params.top_p),
        "top_k": int(params.top_k),  # -1 = whole vocabulary in both
        "max_new_tokens": int(params.max_new_tokens),
        "n": 1,
        "ignore_eos": bool(params.ignore_eos),
    }
    if params.stop_token_ids:
        d["stop_token_ids"] = [int(t) for t in params.stop_token_ids]
    if params.stop:
        d["stop"] = list(params.stop)
    if seed is not None:
        d["sampling_seed"] = int(seed)
    return d


def build_generate_requests(
    prompts: List[List[int]], params: SamplingParams, default_seed: int
) -> Tuple[List[List[int]], List[Dict[str, Any]], List[Tuple[int, int]]]:
    """Expand prompts x n into flat SGLang requests: (input_ids, sampling_params, (i, j)).

    Every request gets its own ``sampling_seed``: request k (prompt-major, k = i * n + j) uses
    ``derive_seed(base, k)`` with base ``params.seed``, or ``default_seed`` when the call has
    none. SGLang honours per-request seeds only with ``enable_deterministic_inference``, and
    then gives every unseeded request the same seed (42), so the samples of a prompt (and
    equal prompts) would coincide; its seeded sampler hashes (seed, position), so two
    requests sharing a seed would share their random numbers.
    """
    base = params.seed if params.seed is not None else default_seed
    input_ids, sps, index = [], [], []
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError("empty prompt")
        for j in range(params.n):
            seed = derive_seed(base, i * params.n + j)
            input_ids.append([int(t) for t in p])
            sps.append(to_sglang_sampling_params(params, seed))
            index.append((i, j))
    return input_ids, sps, index


#: Ends every rid the adapter gives SGLang: SGLang's scheduler aborts each request whose rid
#: *starts with* the aborted one (``Scheduler.abort_request``), so no rid may be a prefix of another.
RID_END = "#"
#: How long abort_requests waits for SGLang to take and answer the aborts.
STREAM_ABORT_TIMEOUT_S = 120.0


def sglang_rid(prefix: str, rid: str) -> str:
    """The rid SGLang gets for our request ``rid``: ``prefix`` (one per adapter) + rid + RID_END."""
    if RID_END in rid or RID_END in prefix:
        raise ValueError(f"request id {rid!r} (prefix {prefix!r}) must not contain {RID_END!r}")
    return f"{prefix}{rid}{RID_END}"


def build_stream_request(r: Request, default_seed: int) -> Tuple[List[int], Dict[str, Any]]:
    """(input_ids, sampling_params) of one streamed request: its seed is ``derive_seed(seed, 0)``
    of the request's seed or ``default_seed``, as sample 0 of a blocking call with that seed."""
    check_request(r)
    base = r.params.seed if r.params.seed is not None else default_seed
    return [int(t) for t in r.prompt_ids], to_sglang_sampling_params(r.params, derive_seed(base, 0))


_FINISH_TYPES = {"stop": "stop", "length": "length", "abort": "abort"}


def parse_finish_reason(fr: Any) -> str:
    """SGLang's meta_info["finish_reason"] (``{"type": ...}`` dict, or a string) -> ours."""
    kind = fr.get("type") if isinstance(fr, dict) else fr
    if kind not in _FINISH_TYPES:
        raise ValueError(f"unexpected SGLang finish_reason {fr!r}")
    return _FINISH_TYPES[kind]


def from_sglang_output(out: Dict[str, Any], prompt_ids: List[int],
                       routing_shape: Optional[Tuple[int, ...]] = None) -> GenerationOutput:
    """One SGLang output dict (``return_logprob=True``) -> GenerationOutput; with
    ``routing_shape`` (layers, top_k[, experts]) the ``meta_info["routed_experts"]`` of a request sent with
    ``return_routed_experts`` (rollout/routing.decode_sglang_routed_experts)."""
    meta = out["meta_info"]
    output_ids = [int(t) for t in out["output_ids"]]
    entries = meta.get("output_token_logprobs") or []
    finish = parse_finish_reason(meta.get("finish_reason"))
    if len(entries) != len(output_ids):
        raise ValueError(
            f"SGLang returned {len(output_ids)} output ids but {len(entries)} output_token_logprobs"
        )
    logprobs = []
    for k, (entry, tok) in enumerate(zip(entries, output_ids)):
        lp, tid = entry[0], entry[1]
        if int(tid) != tok:
            raise ValueError(f"logprob entry {k} is for token {tid}, output token is {tok}")
        if lp is None:
            raise ValueError(f"SGLang returned no logprob for output token {k}")
        logprobs.append(float(lp))
    routed = None
    if routing_shape is not None and meta.get("routed_experts") is not None:
        routed = decode_sglang_routed_experts(meta["routed_experts"], *routing_shape)
        want = len(prompt_ids) + len(output_ids) - 1
        if output_ids and routed.shape[0] != want:
            raise ValueError(f"SGLang returned routed experts of {routed.shape[0]} positions, expected {want} "
                             f"(prompt {len(prompt_ids)} + output {len(output_ids)} - 1)")
    return GenerationOutput(
        prompt_ids=list(prompt_ids), output_ids=output_ids, logprobs=logprobs,
        finish_reason=finish, text=out.get("text"), routed_experts=routed if output_ids else None,
    )


def group_outputs(
    flat: List[GenerationOutput], index: List[Tuple[int, int]], num_prompts: int
) -> List[List[GenerationOutput]]:
    if len(flat) != len(index):
        raise ValueError(f"SGLang returned {len(flat)} outputs for {len(index)} requests")
    result: List[List[Optional[GenerationOutput]]] = [[] for _ in range(num_prompts)]
    for out, (i, j) in zip(flat, index):
        if len(result[i]) != j:
            raise ValueError("requests were not expanded in prompt-major order")
        result[i].append(out)
    return result  # type: ignore[return-value]


def build_score_requests(
    sequences: List[List[int]], prompt_lens: Sequence[int]
) -> Tuple[List[List[int]], List[Dict[str, Any]], List[int]]:
    """(input_ids, sampling_params, logprob_start_len) for a prefill-only scoring call.

    SGLang's input_token_logprobs cover tokens ``ids[logprob_start_len:]``, the first being
    None (no context), so start at ``prompt_len - 1`` to get logprobs of ``ids[prompt_len:]``.
    """
    if len(sequences) != len(prompt_lens):
        raise ValueError("sequences and prompt_lens differ in length")
    ids, sps, starts = [], [], []
    for s, p in zip(sequences, prompt_lens):
        if not 1 <= p <= len(s):
            raise ValueError(f"prompt_len {p} out of range [1, {len(s)}]")
        ids.append([int(t) for t in s])
        sps.append({"max_new_tokens": 0, "temperature": 1.0})
        starts.append(int(p) - 1)
    return ids, sps, starts


def _is_reported_id(reported: int, token: int, vocab_size: Optional[int]) -> bool:
    """SGLang 0.5.23 reports input ids ``>= vocab_size - 1`` as 0 in input_token_logprobs
    (its logprob_result_processor clips "padded hash values"); the logprob itself is the
    real token's (the gather clamps ids to ``vocab_size - 1`` only, a no-op for real ids)."""
    if reported == token:
        return True
    return reported == 0 and (vocab_size is None or token >= vocab_size - 1)


def from_sglang_score_output(
    out: Dict[str, Any], sequence: List[int], prompt_len: int, vocab_size: Optional[int] = None
) -> List[float]:
    """Logprobs of ``sequence[prompt_len:]`` from a scoring output. ``vocab_size`` is the
    model config's (SGLang's ``model_config.vocab_size``): ids at its end come back as 0 and are
    accepted there only; without it a 0 is accepted for any id."""
    entries = out["meta_info"].get("input_token_logprobs") or []
    want = len(sequence) - prompt_len
    if want == 0:
        return []
    if len(entries) < want:
        raise ValueError(f"SGLang returned {len(entries)} input logprobs, need {want}")
    tail = entries[len(entries) - want:]
    res = []
    for k, (entry, tok) in enumerate(zip(tail, sequence[prompt_len:])):
        lp, tid = entry[0], entry[1]
        if lp is None or not _is_reported_id(int(tid), int(tok), vocab_size):
            raise ValueError(f"bad input logprob entry {entry!r} for token {tok} at {prompt_len + k}")
        res.append(float(lp))
    return res


def checkpoint_weight_shapes(model_dir) -> Dict[str, Tuple[int, ...]]:
    """HF name -> shape of every tensor in a local safetensors checkpoint (headers only)."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    shapes: Dict[str, Tuple[int, ...]] = {}
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(info["shape"])
    return shapes


def routing_shape(model_dir) -> Optional[Tuple[int, ...]]:
    """(layers, top_k, experts) of a MoE checkpoint's routed experts (config.json
    ``num_hidden_layers``, ``num_experts_per_tok``: the rows SGLang's capturer allocates;
    ``num_experts`` for the storage dtype); None for a dense model."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg)
    if not cfg.get("num_experts_per_tok"):
        return None
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    return int(cfg["num_hidden_layers"]), int(cfg["num_experts_per_tok"]), experts


def tied_embeddings(model_dir) -> bool:
    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.exists():
        return False
    cfg = json.loads(cfg_path.read_text())
    return bool(cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get("tie_word_embeddings", False)))


def config_vocab_size(model_dir) -> Optional[int]:
    """``vocab_size`` of a local checkpoint's config.json (text config for multimodal ones)."""
    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.exists():
        return None
    cfg = json.loads(cfg_path.read_text())
    v = cfg.get("vocab_size", cfg.get("text_config", {}).get("vocab_size"))
    return int(v) if v is not None else None


class _Opaque:
    """Stands in for every global a metadata-only decode does not need (tensor rebuilders,
    storages, fd/IPC handles): constructing or calling it touches no memory."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return self

    def __setstate__(self, state):
        pass


class _MetadataUnpickler(pickle.Unpickler):
    _KEEP = {("torch", "Size"), ("torch", "dtype"), ("copyreg", "__newobj__"), ("copyreg", "_reconstructor"),
             ("builtins", "object"), ("collections", "OrderedDict")}

    def find_class(self, module, name):
        if (module, name) in self._KEEP or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        if name in ("FlattenedTensorMetadata", "BucketEntry") and module in (
                "sglang.srt.weight_sync.tensor_bucket", "megatron_dapo.rollout.payload"):
            return super().find_class(module, name)
        return _Opaque


def payload_entries(payload) -> List[Tuple[str, Tuple[int, ...]]]:
    """(name, shape) of every tensor a serialized flattened-bucket payload describes, read
    from its metadata without rebuilding any tensor (no CUDA IPC handle or shared memory is
    opened)."""
    data = base64.b64decode(payload, validate=True) if isinstance(payload, str) else bytes(payload)
    obj = _MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, dict) or "metadata" not in obj:
        raise WeightUpdateError("not a flattened-bucket payload (a dict with 'flattened_tensor' and 'metadata')")
    return [(m.name, tuple(m.shape)) for m in obj["metadata"]]


def release_cached_memory(devices) -> None:
    """Return the CUDA caching allocator's free blocks to the driver after buffers on these
    devices were freed (the colocated trainer needs the memory back); nothing for CPU ones."""
    if any(torch.device(d).type == "cuda" for d in devices):
        torch.cuda.empty_cache()


# --------------------------------------------------------------------- the adapter ----
#: SGLang's fused parameters (Qwen2/Qwen3/Llama ``stacked_params_mapping``) and the HF tensors
#: the weight sync writes into them
FUSED_FROM_HF = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def hf_sources(sglang_name: str) -> List[str]:
    """The HF tensors that are loaded into SGLang's parameter ``sglang_name`` (itself when not fused)."""
    for fused, parts in FUSED_FROM_HF.items():
        if f".{fused}." in sglang_name:
            return [sglang_name.replace(f".{fused}.", f".{p}.") for p in parts]
    return [sglang_name]


def rank_checksums(ranks) -> Dict[str, Dict[str, str]]:
    """SGLang's ``check_weights`` answer to "checksum" (one ChecksumInfo dict per GPU rank:
    ``checksums`` {SGLang parameter name: hash}, ``parallelism_info``) -> {rank label: checksums}."""
    out: Dict[str, Dict[str, str]] = {}
    for info in ranks or []:
        p = info["parallelism_info"]
        p = p[0] if isinstance(p, (list, tuple)) else p
        label = f"tp rank {p['tp_rank']}"
        if p.get("dp_size", 1) > 1:
            label += f" dp rank {p['dp_rank']}"
        if p.get("pp_size", 1) > 1:
            label += f" pp rank {p['pp_rank']}"
        if label in out:
            raise WeightUpdateError(f"SGLang check_weights: two answers for {label}")
        out[label] = dict(info["checksums"])
    if not out:
        raise WeightUpdateError("SGLang check_weights('checksum') returned no per-rank checksums")
    return out


def diff_rank_checksums(before: Dict[str, Dict[str, str]], after: Dict[str, Dict[str, str]]) -> List[str]:
    """One line per SGLang parameter whose hash differs between two :func:`rank_checksums`
    (the ranks where it differs, and the HF tensors written into it when it is fused), then
    a line per rank or parameter present only once."""
    differ: Dict[str, List[str]] = {}
    extra = []
    for label in sorted(set(before) | set(after)):
        if label not in before or label not in after:
            extra.append(f"{label}: answered {'only before' if label in before else 'only after'} the sync")
            continue
        b, a = before[label], after[label]
        for name in sorted(set(b) | set(a)):
            if name not in b or name not in a:
                extra.append(f"{name} ({label}): reported {'only before' if name in b else 'only after'} the sync")
            elif b[name] != a[name]:
                differ.setdefault(name, []).append(label)
    out = []
    for name, labels in differ.items():
        src = hf_sources(name)
        fused = f"; written from HF {', '.join(src)}" if src != [name] else ""
        out.append(f"{name}: hash differs on {', '.join(labels)}{fused}")
    return out + extra


def _import_sglang():
    try:
        import sglang  # noqa: F401  (sglang: GPU only, imported when an engine starts)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(INSTALL_HINT) from e
    return sglang


class SGLangEngine(RolloutEngine):
    """``sglang.Engine`` behind the RolloutEngine interface (token ids in and out).

    ``expected_shapes``: HF name -> shape used to validate buckets and the completeness of a
    weight update; by default read from the safetensors headers of a local ``model_path``.
    With tied embeddings (config.json) a ``lm_head.weight`` in a bucket is accepted, checked
    against the embedding's shape and not sent (the engine's head is its embedding). ``None`` and a non-local path:
    names and shapes are not checked (a warning is logged).

    Launched with ``load_format="dummy"`` (random weights): ``generate`` and ``score`` raise
    until the first complete weight update, and again after ``resume_memory(["weights"])``
    until the next one (the resumed memory's contents are undefined), like HFEngine.
    """

    def __init__(
        self,
        model_path: str,
        *,
        tp_size: int = 1,
        mem_fraction_static: float = 0.5,
        base_gpu_id: int = 0,
        enable_memory_saver: bool = True,
        dtype: str = "bfloat16",
        random_seed: Optional[int] = None,
        enable_deterministic_inference: bool = False,
        logprobs_mode: str = "processed",
        expected_shapes: Optional[Dict[str, Tuple[int, ...]]] = None,
        load_format: str = "dummy",
        tokenizer_path: Optional[str] = None,
        **server_args,
    ) -> None:
        super().__init__()
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        unknown = sorted(set(server_args) - set(USED_API["server_args"]))
        if unknown:
            raise TypeError(f"server args {unknown} are not in USED_API['server_args'] (add and test them)")
        self.logprobs_mode = logprobs_mode
        self.tp_size = int(tp_size)
        _set_logprob_env(logprobs_mode)
        _set_graph_saver_env(enable_memory_saver, bool(server_args.get("disable_cuda_graph", False)))
        sglang = _import_sglang()
        from sglang.srt.utils.common import MultiprocessingSerializer  # sglang: GPU only, as above
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

        monkey_patch_torch_reductions()  # sender side: CUDA IPC handles carry device UUIDs
        self._serializer = MultiprocessingSerializer.serialize
        self._metadata_cls = FlattenedTensorMetadata

        self.tied = False
        self.vocab_size: Optional[int] = None
        if Path(model_path).is_dir():
            if expected_shapes is None:
                expected_shapes = checkpoint_weight_shapes(model_path)
            self.tied = tied_embeddings(model_path)
            self.vocab_size = config_vocab_size(model_path)
        if expected_shapes is None:
            logger.warning("SGLangEngine: no expected weight names for %s; updates are not checked", model_path)
        self._shapes = expected_shapes
        # per-call seeds when a request brings none (see build_generate_requests)
        self._seed_rng = random.Random(random_seed)
        self._session_open = False
        self._streams: Dict[str, _Stream] = {}  # our rid -> its async_generate task
        self._rid_prefix = f"mdapo-{uuid.uuid4().hex[:12]}-"
        self._held: List[torch.Tensor] = []  # flat buffers SGLang may still be copying from
        self._session_devices: set = set()  # devices of the buffers freed in this session
        # load_format="dummy": nothing valid until the first complete sync
        self._weights_valid = load_format != "dummy"
        kwargs = build_engine_kwargs(
            model_path, tp_size=tp_size, mem_fraction_static=mem_fraction_static,
            base_gpu_id=base_gpu_id, enable_memory_saver=enable_memory_saver, dtype=dtype,
            random_seed=random_seed, enable_deterministic_inference=enable_deterministic_inference,
            load_format=load_format, tokenizer_path=tokenizer_path, **server_args,
        )
        self._engine = sglang.Engine(**kwargs)
        # routing replay: (layers, top_k) of a MoE checkpoint launched with enable_return_routed_experts
        self._routing_shape = routing_shape(model_path) if server_args.get("enable_return_routed_experts") else None

    def _wants_routing(self, params: SamplingParams) -> bool:
        if not params.return_routed_experts:
            return False
        if self._routing_shape is None:
            raise ValueError("return_routed_experts: launch SGLangEngine(enable_return_routed_experts=True) on a "
                             "mixture-of-experts checkpoint (--routing-replay)")
        return True

    # generation
    def _check_can_generate(self, what: str) -> None:
        super()._check_can_generate(what)
        self._check_not_released(CUDA_GRAPH, what)  # SGLang would replay graphs on freed memory
        if not self._weights_valid:
            raise EngineReleasedError(
                f"SGLangEngine.{what}() called before a complete weight update (update_weights ... "
                "finish_weight_update) since launch (load_format='dummy') or resume_memory(['weights']): "
                "weights are undefined"
            )

    def generate(self, prompts, params: SamplingParams):
        self._check_can_generate("generate")
        ids, sps, index = build_generate_requests(prompts, params, self._seed_rng.getrandbits(63))
        if not ids:
            return [[] for _ in prompts]
        routed = self._wants_routing(params)
        if routed:  # (only then: the flag needs the engine launched with enable_return_routed_experts)
            outs = self._engine.generate(input_ids=ids, sampling_params=sps, return_logprob=True,
                                         return_routed_experts=True)
        else:
            outs = self._engine.generate(input_ids=ids, sampling_params=sps, return_logprob=True)
        shape = self._routing_shape if routed else None
        flat = [from_sglang_output(o, p, shape) for o, p in zip(outs, ids)]
        return group_outputs(flat, index, len(prompts))

    # streaming
    def submit(self, requests) -> None:
        self._check_can_generate("submit")
        loop = self._engine.loop
        for r in requests:
            if r.rid in self._streams:
                raise ValueError(f"request id {r.rid!r} is already outstanding")
            ids, sp = build_stream_request(r, self._seed_rng.getrandbits(63))
            srid = sglang_rid(self._rid_prefix, r.rid)
            routed = self._wants_routing(r.params)
            if routed:
                coro = self._engine.async_generate(input_ids=ids, sampling_params=sp, return_logprob=True, rid=srid,
                                                   return_routed_experts=True)
            else:
                coro = self._engine.async_generate(input_ids=ids, sampling_params=sp, return_logprob=True, rid=srid)
            task = loop.create_task(coro)
            st = _Stream(task, srid, ids, routing_shape=self._routing_shape if routed else None)
            task.add_done_callback(functools.partial(_stamp, st))
            self._streams[r.rid] = st

    def poll(self, timeout_s: float = 1.0) -> List[Finished]:
        tasks = [st.task for st in self._streams.values()]
        if tasks and not any(t.done() for t in tasks):
            self._engine.loop.run_until_complete(
                asyncio.wait(tasks, timeout=max(0.0, float(timeout_s)), return_when=asyncio.FIRST_COMPLETED))
        return self._take([rid for rid, st in self._streams.items() if st.task.done()])

    def abort_requests(self, rids=None) -> List[Finished]:
        want = [rid for rid in (self._streams if rids is None else rids) if rid in self._streams]
        running = [rid for rid in want if not self._streams[rid].task.done()]
        self._run_until(lambda: all(self._dispatched(rid) for rid in running), "reach the scheduler")
        tm = self._engine.tokenizer_manager
        for rid in running:
            if not self._streams[rid].task.done():
                tm.abort_request(rid=self._streams[rid].srid)
        self._run_until(lambda: all(self._streams[rid].task.done() for rid in running), "answer their abort")
        return self._take(want)

    def _dispatched(self, rid: str) -> bool:
        st = self._streams[rid]
        state = self._engine.tokenizer_manager.rid_to_state.get(st.srid)
        return st.task.done() or (state is not None and state.dispatched)

    def _run_until(self, cond, what: str, timeout_s: float = STREAM_ABORT_TIMEOUT_S) -> None:
        """Drive the Engine's loop until ``cond()`` holds; an error after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"SGLang: aborted requests did not {what} within {timeout_s:.0f}s")
            self._engine.loop.run_until_complete(asyncio.sleep(0.005))

    def _take(self, rids) -> List[Finished]:
        out = []
        for rid in rids:
            st = self._streams.pop(rid)
            out.append(Finished(rid, from_sglang_output(st.task.result(), st.input_ids, st.routing_shape),
                                st.finished_at or time.time()))
        return out

    def score(self, sequences, prompt_lens):
        self._check_can_generate("score")
        ids, sps, starts = build_score_requests(sequences, prompt_lens)
        if not ids:
            return []
        outs = self._engine.generate(
            input_ids=ids, sampling_params=sps, return_logprob=True, logprob_start_len=starts
        )
        return [from_sglang_score_output(o, s, p, self.vocab_size) for o, s, p in zip(outs, ids, prompt_lens)]

    # weights
    def expected_weight_names(self) -> List[str]:
        if self._shapes is None:
            return sorted(self._received)
        names = set(self._shapes)
        if self.tied:
            names.discard("lm_head.weight")
        return sorted(names)

    def _check_entries(self, named_shapes) -> List[str]:
        """Names (and shapes, where given) of a bucket against the checkpoint; returns the
        names that count for completeness (a tied lm_head does not)."""
        out = []
        emb = (self._shapes or {}).get("model.embed_tokens.weight")
        for name, shape in named_shapes:
            if self.tied and name == "lm_head.weight":
                if shape is not None and emb is not None and tuple(shape) != tuple(emb):
                    raise WeightUpdateError(
                        f"shape mismatch for 'lm_head.weight': bucket has {tuple(shape)}, "
                        f"tied embedding has {tuple(emb)}"
                    )
                continue
            if self._shapes is not None:
                if name not in self._shapes:
                    raise WeightUpdateError(f"unknown parameter name {name!r} in weight bucket")
                if shape is not None and tuple(shape) != tuple(self._shapes[name]):
                    raise WeightUpdateError(
                        f"shape mismatch for {name!r}: bucket has {tuple(shape)}, "
                        f"checkpoint has {tuple(self._shapes[name])}"
                    )
            out.append(name)
        return out

    def begin_weight_update(self) -> None:
        """Open SGLang's weight-update session (``update_weights`` opens it when needed)."""
        self._check_not_released(WEIGHTS, "begin_weight_update")
        if not self._session_open:
            _check_result(self._engine.begin_weight_update(), "begin_weight_update")
            self._session_open = True

    def _load_bucket(self, bucket):
        names = self._check_entries([(n, tuple(t.shape)) for n, t in bucket])
        if self.tied:
            # The tied head is the embedding: the engine gets embed_tokens, lm_head is dropped.
            bucket = [(n, t) for n, t in bucket if n != "lm_head.weight"]
        if not bucket:
            return []
        payloads, flat = serialize_bucket(
            bucket, self.tp_size, metadata_cls=self._metadata_cls, serializer=self._serializer
        )
        self._send(payloads, hold=flat)
        return names

    def update_weights_from_payloads(self, payloads: Sequence[Any], names: Optional[Sequence[str]] = None) -> None:
        """Load a bucket that is already serialized: ``payloads[k]`` is TP rank k's
        ``{"flattened_tensor", "metadata"}`` payload (SGLang's FlattenedTensorMetadata entries),
        referring to memory on rank k's GPU that its sender keeps untouched until this call
        returns and the next call to this engine has returned (or ``finish_weight_update``
        has). The names and shapes are read from payload 0's metadata (no tensor is rebuilt
        here), checked against the checkpoint and counted for completeness; ``names``, if
        given, must be the same names."""
        self._check_not_released(WEIGHTS, "update_weights_from_payloads")
        if len(payloads) != self.tp_size:
            raise ValueError(
                f"update_weights_from_payloads needs one payload per TP rank: got {len(payloads)}, "
                f"tp_size is {self.tp_size}"
            )
        entries = payload_entries(payloads[0])
        if names is not None and list(names) != [n for n, _ in entries]:
            raise WeightUpdateError(f"names {list(names)} differ from the payload's {[n for n, _ in entries]}")
        checked = self._check_entries(entries)
        self._send(list(payloads), hold=None)
        self._received.update(checked)

    def _send(self, payloads, hold: Optional[torch.Tensor]) -> None:
        self.begin_weight_update()
        try:
            result = self._engine.update_weights_from_tensor(
                named_tensors=payloads, load_format=FLATTENED_BUCKET, flush_cache=False
            )
            _check_result(result, "update_weights_from_tensor")
        except BaseException:
            if hold is not None:
                self._held.append(hold)
            self._close_session(failed=True)
            raise
        # The scheduler handles calls in order: returning from this call, it is done with
        # the previous bucket (and has dropped its mapping), so that buffer may go; this
        # bucket's copies may still be queued on its device, so this buffer stays held
        # until the next call returns or the session ends.
        self._free_held()
        if hold is not None:
            self._held.append(hold)

    def _end_weight_update(self) -> None:
        self._close_session(failed=False)

    def _close_session(self, failed: bool) -> None:
        try:
            if self._session_open:
                self._session_open = False
                result = self._engine.end_weight_update()
                if not failed:
                    _check_result(result, "end_weight_update")
        finally:
            self._free_held()
            # the buffers' memory goes back to the driver once per session, not per bucket
            release_cached_memory(self._session_devices)
            self._session_devices = set()

    def _free_held(self) -> None:
        self._session_devices.update(t.device for t in self._held)
        self._held = []

    def finish_weight_update(self) -> None:
        self._weights_valid = False
        super().finish_weight_update()  # ends the session, flushes, raises on missing names
        self._weights_valid = True

    def check_weights(self, action: str) -> List[str]:
        """``RolloutEngine.check_weights`` through SGLang's own weight checker, by SGLang's
        parameter names (fused qkv_proj / gate_up_proj, TP shards): "snapshot" and "compare"
        ask every rank for the hash of each of its parameters (checker action "checksum",
        gathered over the TP ranks) and compare them per rank here; "reset_tensors" is the
        checker's own (random values in every parameter). The checker's "snapshot"/"compare"
        actions are not used: only TP rank 0's compare result reaches the caller (every rank
        answers, the others' answers are dropped), and the snapshot is a host copy of all the
        engine's weights kept until the compare."""
        check_weight_action(action)
        self._check_not_released(WEIGHTS, f"check_weights({action!r})")
        if action == "reset_tensors":
            self._weight_checker("reset_tensors")
            self._weights_valid = False  # random until the next complete update
            return []
        now = rank_checksums(self._weight_checker("checksum"))
        if action == "snapshot":
            self._checksum_snapshot = now
            return []
        before = getattr(self, "_checksum_snapshot", None)
        if before is None:
            raise RuntimeError("SGLangEngine.check_weights('compare') without a snapshot: call check_weights('snapshot') first")
        self._checksum_snapshot = None
        return diff_rank_checksums(before, now)

    def _weight_checker(self, action: str):
        """One call of SGLang's weight checker on the target model; the per-rank answers."""
        from sglang.srt.managers.io_struct import CheckWeightsReqInput  # sglang: GPU only

        req = CheckWeightsReqInput(action=action, allow_quant_error=False, skip_tensor_list=None, selector="target")
        tm = self._engine.tokenizer_manager
        result = self._engine.loop.run_until_complete(tm.check_weights(req, None))
        _check_result(result, f"check_weights(action={action!r})")
        return result[2]

    def weight_checksums(self, dtypes=None):
        """Not available from sglang 0.5.23 by HF name: ``Engine.get_weights_by_name`` exists
        for a few model classes only (Llama, not Qwen2/Qwen3) and returns a truncated list of
        floats; its weights checker (``check_weights``, action "checksum") hashes SGLang's own
        parameters per TP rank (fused qkv_proj / gate_up_proj, vocab-padded embeddings,
        TP shards), which no HF-name checksum of the trainer can be compared with. The
        weight-sync check skips the checksum half for this engine (the logprob half runs);
        the exact check for this engine is :meth:`check_weights` (``--check-weight-sync-init``)."""
        raise NotImplementedError(
            f"sglang {SGLANG_VERSION} offers no per-HF-tensor read-back of the engine's weights"
        )

    # memory
    def _release(self, tags):
        if self._streams:
            raise RuntimeError(
                f"SGLangEngine.release_memory({list(tags)}) with {len(self._streams)} streamed requests outstanding: "
                "abort_requests() (or poll them to the end) first"
            )
        result = self._engine.release_memory_occupation(tags=list(tags))
        _check_result(result, "release_memory_occupation")
        if WEIGHTS in tags:
            self._weights_valid = False

    def _resume(self, tags):
        result = self._engine.resume_memory_occupation(tags=list(tags))
        _check_result(result, "resume_memory_occupation")
        if WEIGHTS in tags:
            self._weights_valid = False  # contents undefined until a complete update
            self._received = set()

    # misc
    def flush_cache(self) -> None:
        _check_result(self._engine.flush_cache(), "flush_cache")

    def abort(self) -> None:
        tm = self._engine.tokenizer_manager
        loop = self._engine.loop
        call = functools.partial(tm.abort_request, abort_all=True)
        if loop.is_running():
            loop.call_soon_threadsafe(call)
        else:
            call()

    def health(self) -> bool:
        if self._engine is None:
            return False
        try:
            self._engine.get_server_info()
            return True
        except Exception:  # noqa: BLE001 - any failure means unhealthy
            return False

    def shutdown(self) -> None:
        if self._engine is not None:
            self._held = []
            self._engine.shutdown()
            self._engine = None


@dataclass
class _Stream:
    task: Any  # asyncio.Task of Engine.async_generate
    srid: str
    input_ids: List[int]
    finished_at: Optional[float] = None
    routing_shape: Optional[Tuple[int, ...]] = None  # (layers, top_k, experts): return_routed_experts was asked


def _stamp(st: _Stream, _task) -> None:
    st.finished_at = time.time()


def _set_logprob_env(mode: str) -> None:
    cur = os.environ.get(RAW_LOGPROB_ENV)
    if mode == "raw":
        if cur is not None and cur.lower() not in ("1", "true", "yes", "on"):
            raise RuntimeError(f"{RAW_LOGPROB_ENV}={cur!r} conflicts with logprobs_mode='raw'")
        os.environ[RAW_LOGPROB_ENV] = "1"
    elif cur is not None and cur.lower() in ("1", "true", "yes", "on"):
        raise RuntimeError(f"{RAW_LOGPROB_ENV}={cur!r} conflicts with logprobs_mode='processed'")


def _set_graph_saver_env(enable_memory_saver: bool, disable_cuda_graph: bool) -> None:
    """Set what :func:`graph_saver_launch` asks before SGLang starts its scheduler processes
    (they inherit the environment); a conflicting value already set is an error."""
    for name, value in graph_saver_launch(enable_memory_saver, disable_cuda_graph)[0].items():
        cur = os.environ.get(name)
        if cur is not None and cur.lower() not in ("1", "true"):
            raise RuntimeError(
                f"{name}={cur!r} conflicts with enable_memory_saver=True: the 'cuda_graph' memory tag would free "
                f"nothing (unset it, or launch with disable_cuda_graph=True)"
            )
        os.environ[name] = value


def _check_result(result, what: str) -> None:
    """SGLang control calls return (success, message[, ...]) tuples (begin/end_weight_update,
    update_weights_from_tensor), objects with .success (flush_cache) or None
    (release/resume_memory_occupation, whose failures raise in SGLang)."""
    ok, msg = True, ""
    if isinstance(result, tuple) and result and isinstance(result[0], bool):
        ok, msg = result[0], (result[1] if len(result) > 1 else "")
    elif hasattr(result, "success"):
        ok, msg = bool(result.success), getattr(result, "message", "")
    elif result is not None:
        raise RuntimeError(f"SGLang {what} returned an unexpected result {result!r}")
    if not ok:
        raise RuntimeError(f"SGLang {what} failed: {msg}")
