"""Tiny random models shared by tests (HF configs and weights built in-process, no hub)."""

from __future__ import annotations

_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=10000.0,
    hidden_act="silu",
    bos_token_id=1,
    eos_token_id=2,
    dtype="float32",
)


def tiny_qwen2_config(**over) -> dict:
    """Qwen2: QKV bias, GQA, untied embeddings."""
    return {
        **_COMMON,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        **over,
    }


def tiny_llama_config(**over) -> dict:
    """Llama: no biases, GQA, tied embeddings (like SmolLM2)."""
    return {
        **_COMMON,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        **over,
    }


def tiny_qwen3_config(**over) -> dict:
    """Qwen3: q/k norms, no QKV bias, GQA, head_dim 32 (not hidden / heads = 16), tied
    embeddings (like Qwen3-0.6B)."""
    return {
        **_COMMON,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "rms_norm_eps": 1e-6,
        "head_dim": 32,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "use_sliding_window": False,
        **over,
    }


def tiny_qwen3_moe_config(**over) -> dict:
    """Qwen3-MoE: q/k norms, 8 experts of width 32, top-2 with renormalised probabilities,
    2 layers, untied embeddings (like Qwen3-30B-A3B, scaled down)."""
    return {
        **_COMMON,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "rms_norm_eps": 1e-6,
        "num_hidden_layers": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "use_sliding_window": False,
        **over,
    }


def random_hf_model(cfg: dict, seed: int = 0):
    """A transformers model with random weights for ``cfg`` (fp32, CPU, eval mode)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    conf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("architectures",)})
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    with torch.no_grad():  # norms away from 1 and biases non-zero so layouts matter
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif n.endswith("mlp.gate.weight"):  # the router: spread logits, so top-k is clear-cut
                p.copy_(0.3 * torch.randn_like(p))
            elif ".experts." in n:  # transformers' init leaves fused experts at N(0, 0.02)
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def checkpoint_state_dict(model) -> dict:
    """``model``'s tensors under the names of its HF checkpoint files (what ``save_pretrained``
    writes: transformers stores a MoE layer's fused experts as one tensor per expert), read
    back from a temporary directory."""
    import glob
    import os
    import tempfile

    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        out = {}
        for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
            out.update(load_file(f))
    return out
