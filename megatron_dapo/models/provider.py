"""Build a megatron-core ``GPTModel`` + ``TransformerConfig`` from an HF config
(Qwen2/Qwen2.5, Qwen3 with its q/k norms, Qwen3-MoE on megatron-core's MoE layer, Llama).

Parallelism is applied from outside: the caller initialises megatron's ``parallel_state``
(``megatron_dapo.distributed.init_parallel``) and this module builds the local stage/shard of
the model for the calling rank. The layer spec (``--transformer-impl``): Transformer Engine's
on a CUDA machine (a TE that does not import there is an error naming the import error, never
a silent switch), megatron-core's local spec on the CPU or when ``local`` is asked for.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .. import platform, platform_imports
from .hf_config import ModelArch, padded_vocab_size, parse_hf_config


@dataclasses.dataclass
class ModelBuildOptions:
    """What the run adds on top of the checkpoint's architecture."""

    params_dtype: torch.dtype = torch.float32
    bf16: bool = False
    sequence_parallel: bool = False
    make_vocab_size_divisible_by: int = 128
    recompute_granularity: Optional[str] = None
    recompute_method: Optional[str] = None
    recompute_num_layers: Optional[int] = None
    context_parallel_size: int = 1
    use_te: Optional[bool] = None  # None: TE on CUDA (must import), local on CPU; see resolve_use_te
    deterministic: bool = False
    # False: parameters are left uninitialised (torch.empty), for callers that load every
    # weight right after building (checkpoint conversion: no init time, pages untouched).
    perform_initialization: bool = True
    # Mixture of experts (ignored for dense models); docs/moe.md. The expert-parallel sizes
    # come from the parallel state (``distributed.init_parallel``).
    moe: "MoEOptions" = dataclasses.field(default_factory=lambda: MoEOptions())
    # LoRA (training/lora.py): the TE spec's input norms as modules of their own, so that the QKV
    # and fc1 linears (and their adapters) see the normalised input
    unfuse_norms: bool = False


@dataclasses.dataclass
class MoEOptions:
    """How a mixture-of-experts model is trained (the flags of ``config.schema.MoEConfig``)."""

    #: load-balancing loss: "aux_loss" (Switch Transformer, per micro-batch), "seq_aux_loss"
    #: (per sequence), "global_aux_loss" (over the DP group), "none"
    load_balancing_type: str = "aux_loss"
    #: its coefficient; None: the HF config's ``router_aux_loss_coef`` (Qwen3-MoE: 0.001)
    aux_loss_coeff: Optional[float] = None
    #: DeepSeek-V3's aux-loss-free balancing bias (megatron-core: sigmoid scores only)
    enable_expert_bias: bool = False
    bias_update_rate: float = 1e-3
    #: "alltoall" or "allgather"
    token_dispatcher_type: str = "alltoall"
    #: grouped GEMM experts (TEGroupedMLP); None: with the TE spec, not with the local one
    grouped_gemm: Optional[bool] = None

    def aux_loss_coeff_for(self, arch: ModelArch) -> float:
        if self.load_balancing_type == "none":
            return 0.0
        return float(arch.router_aux_loss_coef if self.aux_loss_coeff is None else self.aux_loss_coeff)


def _moe_config(arch: ModelArch, opts: ModelBuildOptions) -> dict:
    """TransformerConfig fields of the mixture of experts (empty for a dense model).

    Routing as the HF model: softmax over the expert logits, top-k, and the top-k
    probabilities renormalised when ``norm_topk_prob`` (megatron: top-k of the logits, then a
    softmax over them: the same probabilities); without it, the softmax over all experts
    first (``moe_router_pre_softmax``)."""
    if not arch.is_moe:
        return {}
    from megatron.core import parallel_state as ps  # megatron-core: imported when a model is built (models/__init__)

    m = opts.moe
    if arch.moe_router_topk == 1 and arch.moe_norm_topk_prob:
        raise ValueError("num_experts_per_tok=1 with norm_topk_prob=true (every weight 1.0) is not supported")
    grouped = resolve_use_te(opts.use_te) if m.grouped_gemm is None else bool(m.grouped_gemm)
    return dict(
        num_moe_experts=arch.num_experts,
        moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
        moe_router_topk=arch.moe_router_topk,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not arch.moe_norm_topk_prob,
        moe_router_load_balancing_type=m.load_balancing_type,
        moe_aux_loss_coeff=m.aux_loss_coeff_for(arch),
        moe_router_enable_expert_bias=m.enable_expert_bias,
        moe_router_bias_update_rate=m.bias_update_rate,
        moe_token_dispatcher_type=m.token_dispatcher_type,
        moe_grouped_gemm=grouped,
        expert_model_parallel_size=ps.get_expert_model_parallel_world_size(),
        expert_tensor_parallel_size=ps.get_expert_tensor_parallel_world_size(),
    )


def transformer_config_from_arch(arch: ModelArch, opts: ModelBuildOptions):
    """The megatron-core ``TransformerConfig`` of an HF architecture under the current parallel state."""
    from megatron.core import parallel_state as ps  # megatron-core: imported when a model is built
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp = ps.get_tensor_model_parallel_world_size()
    pp = ps.get_pipeline_model_parallel_world_size()
    on_gpu = torch.cuda.is_available()
    moe = _moe_config(arch, opts)
    if not moe:
        moe = dict(moe_token_dispatcher_type="alltoall")
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=opts.context_parallel_size,
        sequence_parallel=opts.sequence_parallel and tp > 1,
        params_dtype=opts.params_dtype,
        bf16=opts.bf16,
        pipeline_dtype=opts.params_dtype,
        use_cpu_initialization=not on_gpu,
        perform_initialization=opts.perform_initialization,
        recompute_granularity=opts.recompute_granularity,
        recompute_method=opts.recompute_method,
        recompute_num_layers=opts.recompute_num_layers,
        deterministic_mode=opts.deterministic,
        batch_p2p_comm=False if not on_gpu else True,
        batch_p2p_sync=on_gpu,
        variable_seq_lengths=True,
        **moe,
    )


TRANSFORMER_IMPLS = ("transformer_engine", "local")


def use_te_for(transformer_impl: str) -> Optional[bool]:
    """``ModelBuildOptions.use_te`` of a ``--transformer-impl`` value."""
    if transformer_impl not in TRANSFORMER_IMPLS:
        raise ValueError(f"--transformer-impl must be one of {TRANSFORMER_IMPLS}, got {transformer_impl!r}")
    return None if transformer_impl == "transformer_engine" else False


def _import_te() -> None:  # TE: CUDA only, optional; whether it imports is the question asked
    import transformer_engine  # noqa: F401
    import transformer_engine.pytorch  # noqa: F401


def te_importable() -> bool:
    """Whether Transformer Engine imports here and has CUDA to run on (for scripts that pick
    the layer spec by what the machine has; the trainer itself never falls back silently)."""
    if not torch.cuda.is_available():
        return False
    try:
        _import_te()
    except Exception:  # noqa: BLE001 - any import failure (missing .so, ABI mismatch) counts
        return False
    return True


def resolve_use_te(use_te: Optional[bool] = None) -> bool:
    """Whether the TE layer spec is used. ``False``: local spec. ``None``: TE on a CUDA machine,
    local on the CPU (TE needs CUDA). ``True``: TE. Where TE is to be used and does not import,
    raises naming the import error: the local spec would be a different model path (no
    ``--sequence-parallel``, unfused attention that materialises T x T scores per head)."""
    if use_te is False:
        return False
    if use_te is None and not torch.cuda.is_available():
        return False
    try:
        _import_te()
    except Exception as e:  # noqa: BLE001 - any import failure (missing .so, ABI mismatch) counts
        raise RuntimeError(
            f"Transformer Engine does not import on this CUDA machine ({type(e).__name__}: {e}); fix the "
            "transformer_engine install, or pass --transformer-impl local for megatron-core's local layer spec "
            "(no --sequence-parallel, unfused attention)"
        ) from e
    return True


def layer_spec(
    use_te: Optional[bool] = None, arch: Optional[ModelArch] = None, config=None, unfuse_norms: bool = False
):
    """The TE spec or megatron-core's local spec, as :func:`resolve_use_te` decides.

    TE's attention handles packed (THD) micro-batches and context parallelism itself. The
    local spec's core attention is replaced by :class:`~.attention.PackedDotProductAttention`,
    megatron's ``DotProductAttention`` plus THD segments and CP (K/V all-gather with the
    zigzag causal mask), so the CPU runs the same packed and CP paths.

    ``arch``: Qwen3's q/k norms and the mixture of experts (router, token dispatcher and the
    experts: grouped GEMM (``TEGroupedMLP``) under TE, megatron's ``SequentialMLP`` of local
    linear layers otherwise; ``config.moe_grouped_gemm`` decides).

    ``unfuse_norms`` (LoRA): the TE spec fuses the input norm into the QKV linear and the
    pre-MLP norm into fc1 (``TELayerNormColumnParallelLinear``); here they become TE norms of
    their own before plain TE column-parallel linears, as the local spec has them, so an adapter
    on those linears sees the normalised input. The parameter names are then the local spec's
    (``input_layernorm.weight``), the canonical names of checkpoint/mapping.py.
    """
    from megatron.core.models.gpt import gpt_layer_specs as specs  # megatron-core: when a model is built

    qk = bool(arch is not None and arch.qk_layernorm)
    experts = arch.num_experts if arch is not None and arch.is_moe else None
    grouped = bool(config is not None and getattr(config, "moe_grouped_gemm", False))
    if resolve_use_te(use_te):
        spec = specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=experts, moe_grouped_gemm=grouped, qk_layernorm=qk
        )
        if unfuse_norms:  # CUDA only (TE): checked by benchmarks/gpu_check.py's LoRA section
            from megatron.core.extensions.transformer_engine import TEColumnParallelLinear, TENorm

            sub = spec.submodules
            sub.input_layernorm = TENorm
            sub.self_attention.submodules.linear_qkv = TEColumnParallelLinear
            if not experts:  # a MoE layer's pre-MLP norm is a module of its own already
                sub.pre_mlp_layernorm = TENorm
                mlp_submodules(sub.mlp).linear_fc1 = TEColumnParallelLinear
        return spec
    from .attention import PackedDotProductAttention  # imports megatron-core at its top

    if experts:
        platform.apply_moe_cpu_patches()
    spec = specs.get_gpt_layer_local_spec(
        num_experts=experts, moe_grouped_gemm=grouped, qk_layernorm=qk, normalization="RMSNorm"
    )
    spec.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    return spec


def mlp_submodules(mlp):
    """The ``MLPSubmodules`` of a dense MLP's spec: a ``ModuleSpec`` (megatron-core 0.16) or a
    ``functools.partial`` of ``MLP.as_mlp_submodule`` (0.19)."""
    return mlp.submodules if hasattr(mlp, "submodules") else mlp.keywords["submodules"]


#: megatron-core 0.19 logs this on every GPTModel build (it is "only accepting critical bug fixes",
#: HybridModel is its successor): docs/design.md, "megatron-core releases", says what moving would
#: change. The line is dropped here, once per process, so that it does not fill every rank's log.
GPTMODEL_DEPRECATION = "GPTModel IS DEPRECATED"
_GPT_LOGGER = "megatron.core.models.gpt.gpt_model"


def quiet_gptmodel_deprecation() -> None:
    """Filter megatron-core's GPTModel deprecation line out of its logger (idempotent)."""
    platform_imports.drop_log_lines(_GPT_LOGGER, GPTMODEL_DEPRECATION)


def build_gpt_model(hf_config, opts: Optional[ModelBuildOptions] = None, *, pre_process=None, post_process=None):
    """Build the calling rank's part of the megatron-core GPTModel for ``hf_config``.

    ``hf_config`` is an HF checkpoint directory, a config.json path, a dict or a ModelArch.
    Returns ``(model, arch, transformer_config)``.
    """
    from megatron.core import parallel_state as ps  # megatron-core: when a model is built
    from megatron.core.models.gpt.gpt_model import GPTModel

    opts = opts or ModelBuildOptions()
    arch = hf_config if isinstance(hf_config, ModelArch) else parse_hf_config(hf_config)
    cfg = transformer_config_from_arch(arch, opts)
    if pre_process is None:
        pre_process = ps.is_pipeline_first_stage()
    if post_process is None:
        post_process = ps.is_pipeline_last_stage()
    vocab = padded_vocab_size(arch.vocab_size, opts.make_vocab_size_divisible_by, cfg.tensor_model_parallel_size)
    quiet_gptmodel_deprecation()
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=layer_spec(opts.use_te, arch, cfg, opts.unfuse_norms),
        vocab_size=vocab,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta) if float(arch.rope_theta).is_integer() else arch.rope_theta,
    )
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model, arch, cfg


def causal_mask(seq_len: int, device=None) -> torch.Tensor:
    """Explicit causal mask in megatron's convention (True = masked), shape [1, 1, s, s].

    megatron's ``get_default_causal_mask`` is CUDA-only, so callers always pass this.
    """
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1).view(
        1, 1, seq_len, seq_len
    )
