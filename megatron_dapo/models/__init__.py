"""Model providers: megatron-core GPTModel from a Hugging Face config (Qwen2/Qwen2.5, Qwen3, Qwen3-MoE, Llama)."""

from .hf_config import (
    MOE_MODEL_TYPES,
    SUPPORTED_MODEL_TYPES,
    ModelArch,
    ModelConfigError,
    hf_config_hash,
    load_hf_config,
    padded_vocab_size,
    parse_hf_config,
)

__all__ = [
    "MOE_MODEL_TYPES",
    "SUPPORTED_MODEL_TYPES",
    "ModelArch",
    "ModelConfigError",
    "hf_config_hash",
    "load_hf_config",
    "padded_vocab_size",
    "parse_hf_config",
    "build_gpt_model",
    "ModelBuildOptions",
    "MoEOptions",
    "causal_mask",
]


def __getattr__(name):  # megatron-core is imported only when a model is built
    if name in (
        "build_gpt_model",
        "ModelBuildOptions",
        "MoEOptions",
        "causal_mask",
        "transformer_config_from_arch",
        "layer_spec",
    ):
        from . import provider

        return getattr(provider, name)
    raise AttributeError(name)
