"""Read a Hugging Face ``config.json`` into a validated, framework-neutral model description.

Only the fields that change the math of a Qwen2/Qwen2.5, Qwen3, Qwen3-MoE or Llama decoder
are read. Any field
this package cannot honour (rope scaling, sliding window, biases where megatron's layout has
none, another activation) is an error naming that field: a silent mismatch would train a
different model than the checkpoint's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Optional

from ..errors import ModelConfigError

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe", "llama")
#: model types with a mixture-of-experts MLP in every layer
MOE_MODEL_TYPES = ("qwen3_moe",)
#: the linear projections of a decoder layer in HF's (and PEFT's) names: what LoRA can target
#: (--lora-target-modules; training/lora.py)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")


def lora_parameters(arch: "ModelArch", rank: int, targets) -> int:
    """Adapter parameters of LoRA rank ``rank`` on ``targets`` over all layers: r x (in + out)
    per adapted projection (training/lora.py)."""
    h, q, kv = arch.hidden_size, arch.num_attention_heads * arch.head_dim, arch.num_query_groups * arch.head_dim
    f = arch.ffn_hidden_size
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    shapes.update({"gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)})
    return arch.num_layers * sum(rank * sum(shapes[t]) for t in targets)


def lora_moe_refusal(arch: "ModelArch", targets) -> Optional[str]:
    """The one line refusing MLP targets on a mixture-of-experts model (adapters go on attention
    only: the experts and the router take none), or None."""
    on_mlp = [t for t in targets if t in LORA_MLP_TARGETS]
    if arch.is_moe and on_mlp:
        return (
            f"--lora-target-modules {','.join(on_mlp)}: {arch.model_type} is a mixture of experts and adapters "
            "go on attention only (q_proj,k_proj,v_proj,o_proj); the experts and the router take none"
        )
    return None


@dataclasses.dataclass(frozen=True)
class ModelArch:
    """The architecture facts megatron-core needs, read from an HF config."""

    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    norm_eps: float
    qkv_bias: bool
    tie_word_embeddings: bool
    bos_token_id: Optional[int] = None
    eos_token_id: Any = None
    # Qwen3: RMSNorm of every query and key head (HF q_norm / k_norm) before RoPE.
    qk_layernorm: bool = False
    # Mixture of experts (Qwen3-MoE; 0 experts: a dense MLP). Every layer's MLP is a router
    # (softmax over ``num_experts`` logits, top ``moe_router_topk``, renormalised when
    # ``moe_norm_topk_prob``) and ``num_experts`` SwiGLU experts of width ``moe_ffn_hidden_size``.
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_router_topk: int = 0
    moe_norm_topk_prob: bool = False
    router_aux_loss_coef: float = 0.0  # HF router_aux_loss_coef: the default of --moe-aux-loss-coeff

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_parameters_per_layer(self) -> int:
        """Parameters of one layer's experts (all of them; the router not counted)."""
        return self.num_experts * 3 * self.hidden_size * self.moe_ffn_hidden_size

    @property
    def num_parameters(self) -> int:
        """Parameter count of the HF model (untied output counted once more)."""
        h, f, L, v = self.hidden_size, self.ffn_hidden_size, self.num_layers, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_query_groups * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        attn += 2 * self.head_dim if self.qk_layernorm else 0
        if self.is_moe:
            mlp = self.num_experts * h + self.expert_parameters_per_layer  # router + experts
        else:
            mlp = 3 * h * f
        per_layer = attn + mlp + 2 * h
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return L * per_layer + emb + h


def load_hf_config(path_or_dict) -> dict:
    """Return the raw config dict of an HF checkpoint directory, a config.json path or a dict."""
    if isinstance(path_or_dict, dict):
        return dict(path_or_dict)
    path = os.fspath(path_or_dict)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"HF config not found: {path} (expected a checkpoint directory with config.json)")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{path}: not valid JSON ({e})") from e


def hf_config_hash(cfg: dict) -> str:
    """Stable hash of the architecture-relevant part of an HF config (stored in checkpoints)."""
    arch = parse_hf_config(cfg).to_dict()
    return hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:16]


def _rope_theta(cfg: dict) -> float:
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        rtype = rp.get("rope_type", "default")
        if rtype not in (None, "default"):
            raise ModelConfigError(
                f"unsupported HF config field rope_parameters.rope_type={rtype!r} (only default RoPE)"
            )
        if "rope_theta" in rp:
            return float(rp["rope_theta"])
    return float(cfg.get("rope_theta", 10000.0))


def _require(cfg: dict, key: str):
    if key not in cfg:
        raise ModelConfigError(f"HF config is missing required field {key!r}")
    return cfg[key]


def parse_hf_config(path_or_dict) -> ModelArch:
    """Validate an HF config of the Qwen2 or Llama family and return its :class:`ModelArch`."""
    cfg = load_hf_config(path_or_dict)
    mtype = cfg.get("model_type")
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise ModelConfigError(
            f"unsupported HF config field model_type={mtype!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if cfg.get("rope_scaling"):
        raise ModelConfigError(f"unsupported HF config field rope_scaling={cfg['rope_scaling']!r} (only plain RoPE)")
    if cfg.get("use_sliding_window"):
        raise ModelConfigError("unsupported HF config field use_sliding_window=true (sliding-window attention)")
    if mtype == "llama" and cfg.get("sliding_window"):
        raise ModelConfigError(f"unsupported HF config field sliding_window={cfg['sliding_window']!r}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"unsupported HF config field hidden_act={act!r} (SwiGLU with silu only)")
    if cfg.get("mlp_bias"):
        raise ModelConfigError("unsupported HF config field mlp_bias=true")
    if mtype in ("llama", "qwen3", "qwen3_moe") and cfg.get("attention_bias"):
        # Llama's and Qwen3's attention_bias also biases o_proj, which megatron's layout cannot
        # express without biasing every linear layer.
        raise ModelConfigError(f"unsupported HF config field attention_bias=true for {mtype}")
    layer_types = cfg.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ModelConfigError(
            f"unsupported HF config field layer_types={sorted(set(layer_types))!r} (full attention in every layer only)"
        )
    moe = _moe_fields(cfg) if mtype in MOE_MODEL_TYPES else {}
    if cfg.get("pretraining_tp", 1) not in (1, None):
        raise ModelConfigError(f"unsupported HF config field pretraining_tp={cfg['pretraining_tp']!r}")

    hidden = int(_require(cfg, "hidden_size"))
    heads = int(_require(cfg, "num_attention_heads"))
    kv = int(cfg.get("num_key_value_heads") or heads)
    # Qwen3's config class defaults head_dim to 128 (its checkpoints all state it); the others
    # derive it from the hidden size, as their HF attention does.
    head_dim = int(cfg.get("head_dim") or (128 if mtype == "qwen3" else hidden // heads))
    if head_dim * heads != hidden and mtype == "qwen2":
        raise ModelConfigError(f"HF config head_dim={head_dim} x num_attention_heads={heads} != hidden_size={hidden}")
    if heads % kv:
        raise ModelConfigError(f"HF config num_attention_heads={heads} not divisible by num_key_value_heads={kv}")
    return ModelArch(
        model_type=mtype,
        num_layers=int(_require(cfg, "num_hidden_layers")),
        hidden_size=hidden,
        ffn_hidden_size=int(_require(cfg, "intermediate_size")),
        num_attention_heads=heads,
        num_query_groups=kv,
        head_dim=head_dim,
        vocab_size=int(_require(cfg, "vocab_size")),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        rope_theta=_rope_theta(cfg),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=(mtype == "qwen2"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", mtype == "llama" and False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=cfg.get("eos_token_id"),
        qk_layernorm=mtype in ("qwen3", "qwen3_moe"),
        **moe,
    )


def _moe_fields(cfg: dict) -> dict:
    """The mixture-of-experts fields of a Qwen3-MoE config (every layer sparse, no shared expert)."""
    # Qwen's released configs say num_experts; transformers >= 5 writes num_local_experts
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    if experts is None:
        raise ModelConfigError("HF config is missing required field 'num_experts' (or 'num_local_experts')")
    experts = int(experts)
    topk = int(_require(cfg, "num_experts_per_tok"))
    if experts < 1 or not 1 <= topk <= experts:
        raise ModelConfigError(
            f"HF config num_experts={experts} / num_experts_per_tok={topk}: need 1 <= "
            "num_experts_per_tok <= num_experts"
        )
    if cfg.get("mlp_only_layers"):
        raise ModelConfigError(
            f"unsupported HF config field mlp_only_layers={cfg['mlp_only_layers']!r} (every layer "
            "must be a mixture-of-experts layer)"
        )
    if int(cfg.get("decoder_sparse_step", 1)) != 1:
        raise ModelConfigError(
            f"unsupported HF config field decoder_sparse_step={cfg['decoder_sparse_step']!r} "
            "(only 1: every layer a mixture-of-experts layer)"
        )
    for key in ("shared_expert_intermediate_size", "n_shared_experts"):
        if cfg.get(key):
            raise ModelConfigError(f"unsupported HF config field {key}={cfg[key]!r} (no shared experts)")
    return dict(
        num_experts=experts,
        moe_ffn_hidden_size=int(_require(cfg, "moe_intermediate_size")),
        moe_router_topk=topk,
        moe_norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        router_aux_loss_coef=float(cfg.get("router_aux_loss_coef", 0.001)),
    )


def padded_vocab_size(vocab_size: int, divisible_by: int, tp_size: int) -> int:
    """Megatron pads the vocabulary so every TP rank holds an equal, aligned slice."""
    multiple = divisible_by * tp_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


def generation_eos_ids(model_dir: str) -> list:
    """The end-of-sequence token ids a checkpoint declares (generation_config.json and
    config.json ``eos_token_id``, int or list): the stop tokens of generation and evaluation."""
    ids = []
    for fname in ("generation_config.json", "config.json"):
        try:
            with open(os.path.join(model_dir, fname)) as f:
                eos = json.load(f).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if eos is not None:
            ids += [eos] if isinstance(eos, int) else list(eos)
    return sorted(set(int(t) for t in ids))
