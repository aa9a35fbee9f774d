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
    return {**_COMMON, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "use_sliding_window": False, **over}


def tiny_llama_config(**over) -> dict:
    """Llama: no biases, GQA, tied embeddings (like SmolLM2)."""
    return {**_COMMON, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, **over}


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
    return model.eval()
