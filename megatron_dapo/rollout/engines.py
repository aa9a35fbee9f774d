"""Engine kinds (``--rollout-engine``): a kind names how to launch, build and feed one engine.

:data:`ENGINE_KINDS` maps a kind to an :class:`EngineKind`; ``--rollout-engine`` takes its
choices from it (plus ``auto``: the first kind that fits the machine, :func:`resolve_engine_kind`).
The driver (``driver/cluster.py``, ``driver/actors.EngineActor``), the weight sync
(``hybrid/weight_sync.EngineProtocol``, :func:`codec_for`), the validation and
the dry-run plan look a kind up here: none of them branches on a kind's name.

This module imports only the standard library: an engine's class, its tokenizer and its
payload codec are imported when an engine is built or fed (SGLang is GPU-only and must never
be imported by ``import megatron_dapo`` on a CPU machine).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Dict, Optional, Tuple

from ..registry import Registry

AUTO = "auto"

#: ``--dtype`` names of a standalone engine (tools/eval.py).
STANDALONE_DTYPES = ("fp32", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class StandaloneOptions:
    """What a standalone engine is built with: ``dtype`` (one of :data:`STANDALONE_DTYPES`),
    ``seed`` (None: unseeded), ``tp`` (GPUs of the engine), ``mem_fraction`` (of the GPU's
    memory for weights and KV cache); a kind reads the options it has."""

    dtype: str = "fp32"
    seed: Optional[int] = None
    tp: int = 1
    mem_fraction: float = 0.85


@dataclasses.dataclass(frozen=True)
class Standalone:
    """How a kind serves a checkpoint by itself, without a trainer (``tools/eval.py``).

    ``build(model_dir, tokenizer, opts: StandaloneOptions) -> engine`` loads the checkpoint's
    own weights. ``dtype``: the default ``--dtype``. ``batch_size``: samples per generate call
    by default (None: all at once)."""

    build: Callable[..., Any]
    dtype: str = "fp32"
    batch_size: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class EngineKind:
    """One engine kind.

    ``engine_class``: ``"module:Class"`` of the engine (a ``rollout.base.RolloutEngine``), imported
    by :meth:`load_class`. ``options(cfg, index, base_gpu_id, tokenizer_dir) -> (engine
    constructor kwargs, Ray actor options)`` of engine ``index`` (``cfg``: the run's
    ``DAPOConfig``). ``build(model_dir, tokenizer_dir, **kwargs) -> (engine, tokenizer or None)``
    runs inside the engine's actor. ``codec() -> (serializer, metadata class)`` of the weight
    payloads the engine accepts (called in every feeder process). ``for_gpu``: made for GPU
    machines (``auto`` picks the first kind whose ``for_gpu`` matches the machine). ``on_cpu``:
    how the kind runs on a machine without a GPU: None, it cannot (refused there); else
    ``on_cpu(cfg) -> None``, or one line refusing a setting the CPU cannot run.
    ``cpu_memory_note``: what the dry-run plan says of the engine's memory release and resume
    on a CPU machine ("": they work as on a GPU).
    ``lag``: buckets the engine may still read after acknowledging one (sizes the feeders'
    buffer ring, ``lag + 2``). ``weight_naming``: ``"transformers"`` (fused experts) or
    ``"checkpoint"`` names. ``title``: the name the dry-run plan prints. ``standalone``: how
    the kind evaluates a checkpoint by itself (:class:`Standalone`; None: it cannot).
    ``broadcast_while_generating``: the engine takes a broadcast weight update
    (``update_weights_from_distributed``) from another thread while it generates (HFEngine holds
    the tensors aside until ``finish_weight_update``); otherwise the driver lets it finish its
    collection first (SGLangEngine: its client drives one event loop from one thread at a time).
    """

    engine_class: str
    doc: str
    options: Callable[..., Tuple[Dict[str, Any], Dict[str, Any]]]
    build: Callable[..., Tuple[Any, Any]]
    codec: Callable[[], tuple]
    for_gpu: bool = False
    on_cpu: Optional[Callable[[Any], Optional[str]]] = None
    cpu_memory_note: str = ""
    lag: int = 0
    weight_naming: str = "checkpoint"
    title: str = ""
    standalone: Optional[Standalone] = None
    broadcast_while_generating: bool = False

    def load_class(self):
        module, name = self.engine_class.split(":")
        return getattr(importlib.import_module(module), name)


#: ``--rollout-engine`` kinds (besides ``auto``), in the order ``auto`` tries them.
ENGINE_KINDS: Registry = Registry("engine kind", flag="--rollout-engine")


def engine_kind(name: str) -> EngineKind:
    """The registered kind ``name`` (ValueError naming ``--rollout-engine`` otherwise)."""
    return ENGINE_KINDS.get(name)


def codec_for(name: str) -> tuple:
    """(serializer, metadata class) for weight payloads into an engine of kind ``name`` (its
    ``codec``, which imports ``rollout.payload``, and for SGLang the pinned wheel, when called;
    ValueError naming --rollout-engine for an unknown kind)."""
    return engine_kind(name).codec()


def engine_choices() -> Tuple[str, ...]:
    """``--rollout-engine``'s choices: ``auto`` and every registered kind."""
    return (AUTO, *ENGINE_KINDS.names())


def resolve_engine_kind(name: str, on_gpu: bool) -> str:
    """``name``, or for ``auto`` the first registered kind made for this machine (GPU or not)."""
    if name != AUTO:
        engine_kind(name)
        return name
    for kind, spec in ENGINE_KINDS.items():
        if spec.for_gpu == bool(on_gpu):
            return kind
    raise ValueError(f"--rollout-engine auto: no engine kind for a {'GPU' if on_gpu else 'CPU'} machine")


# -- HFEngine: transformers on the CPU -----------------------------------------------------------


def _runs_on_cpu(cfg) -> Optional[str]:
    return None


def _hf_options(cfg, index: int, base_gpu_id: int, tokenizer_dir: Optional[str]):
    """Logprobs of the tempered distribution (as the trainer computes them); with
    --check-weight-sync-init the engine starts from the checkpoint (HybridStep._init_check)."""
    from_ckpt = bool(cfg.rollout.check_weight_sync_init)
    return {"logprobs_mode": "processed", **({"load_weights_from": cfg.model.hf_checkpoint} if from_ckpt else {})}, {}


def _hf_build(model_dir: str, tokenizer_dir: Optional[str] = None, **kwargs):
    from transformers import AutoConfig, AutoTokenizer  # heavy: only inside the engine's actor

    engine_cls = ENGINE_KINDS.get("hf").load_class()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else None
    # Built from the config only: the trainer's weight sync fills in the weights.
    return engine_cls(AutoConfig.from_pretrained(model_dir), tokenizer=tok, **kwargs), tok


def _hf_standalone(model_dir: str, tokenizer, opts: StandaloneOptions):
    import torch  # this module imports only the standard library

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[opts.dtype]
    return ENGINE_KINDS.get("hf").load_class()(model_dir, tokenizer=tokenizer, dtype=dtype, seed=opts.seed)


def _hf_codec():
    from .payload import BucketEntry, default_serializer  # torch: only in a feeder process

    return default_serializer, BucketEntry


# -- SGLang on the GPU ---------------------------------------------------------------------------


def _sglang_options(cfg, index: int, base_gpu_id: int, tokenizer_dir: Optional[str]):
    """TP over the engine's GPUs from the physical ``base_gpu_id`` (Ray must not narrow the
    actor's visible devices to the one GPU of its bundle), the tokenizer, a seed per engine,
    deterministic inference with --deterministic (SGLang ignores per-request seeds without it),
    logprobs of the tempered distribution; weights from the checkpoint only with
    --check-weight-sync-init (else "dummy": the first sync fills them in)."""
    r = cfg.rollout
    from_ckpt = bool(r.check_weight_sync_init)
    kw = dict(
        tp_size=r.num_gpus_per_engine,
        mem_fraction_static=r.mem_fraction_static,
        base_gpu_id=base_gpu_id,
        enable_memory_saver=True,
        tokenizer_path=tokenizer_dir,
        random_seed=cfg.optim.seed + index,
        enable_deterministic_inference=cfg.run.deterministic,
        dtype="bfloat16" if cfg.model.bf16 else "float32",
        logprobs_mode="processed",
        load_format="auto" if from_ckpt else "dummy",
    )
    if cfg.moe.routing_replay:  # SGLang captures the routed experts only when launched so
        kw["enable_return_routed_experts"] = True
    return kw, {"runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}}


def _sglang_on_cpu(cfg) -> Optional[str]:
    """What SGLang's CPU engine cannot run (rollout/sglang_cpu.py), refused before anything starts."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return (
            "--rollout-engine sglang: sglang is not installed in this environment (bash scripts/setup_env.sh "
            "installs it on the primary stack, Python 3.12), or use --rollout-engine hf"
        )
    if cfg.moe.routing_replay:
        return (
            "--routing-replay with --rollout-engine sglang on a CPU machine: SGLang captures routed experts in "
            "pinned host memory, which needs a GPU (use --rollout-engine hf on CPU)"
        )
    if cfg.run.deterministic:
        return (
            "--deterministic with --rollout-engine sglang on a CPU machine: SGLang refuses deterministic inference "
            "for its CPU attention backend (torch_native); use --rollout-engine hf, or drop --deterministic"
        )
    return None


def _sglang_build(model_dir: str, tokenizer_dir: Optional[str] = None, **kwargs):
    return ENGINE_KINDS.get("sglang").load_class()(model_dir, **kwargs), None


def _sglang_standalone(model_dir: str, tokenizer, opts: StandaloneOptions):
    """The checkpoint's own weights (load_format "auto"; the adapter's default, "dummy", waits
    for a sync), no memory saver (nothing else shares the GPUs); SGLang loads its own tokenizer."""
    return ENGINE_KINDS.get("sglang").load_class()(
        model_dir,
        tp_size=opts.tp,
        mem_fraction_static=opts.mem_fraction,
        enable_memory_saver=False,
        dtype={"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[opts.dtype],
        random_seed=opts.seed,
        load_format="auto",
    )


def _sglang_codec():
    from .payload import sglang_codec  # imports sglang: GPU feeders only

    return sglang_codec()


ENGINE_KINDS.register(
    "hf",
    EngineKind(
        "megatron_dapo.rollout.hf_engine:HFEngine",
        "HF transformers engine on the CPU (continuous batching); the weight sync copies before it returns.",
        _hf_options,
        _hf_build,
        _hf_codec,
        for_gpu=False,
        on_cpu=_runs_on_cpu,
        lag=0,
        weight_naming="transformers",
        title="HF",
        broadcast_while_generating=True,
        standalone=Standalone(_hf_standalone, dtype="fp32", batch_size=32),
    ),
)
ENGINE_KINDS.register(
    "sglang",
    EngineKind(
        "megatron_dapo.rollout.sglang_engine:SGLangEngine",
        "SGLang on the GPU (TP over --rollout-num-gpus-per-engine GPUs, memory saver, CUDA IPC weight payloads); "
        "on a CPU machine its CPU engine (torch_native attention, no memory release: docs/hybrid.md).",
        _sglang_options,
        _sglang_build,
        _sglang_codec,
        for_gpu=True,
        on_cpu=_sglang_on_cpu,
        cpu_memory_note=(
            "SGLang's CPU engine cannot release memory (its scheduler synchronizes CUDA there): steps 2 and 4-5's "
            "engine release and resume are no-ops, the engine keeps weights and KV cache next to the trainer "
            "(hybrid_events.jsonl: engine_release_noop, engine_resume_weights_noop, engine_resume_kv_cache_noop)"
        ),
        lag=1,
        weight_naming="checkpoint",
        title="SGLang",
        standalone=Standalone(_sglang_standalone, dtype="bf16", batch_size=None),
    ),
)
