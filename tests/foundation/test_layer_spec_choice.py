"""Which layer spec a CUDA machine gets (models.provider): TE where it imports, and the trainer
never falls back to the local spec silently; scripts that pick by what the machine has use
te_importable(). The CUDA answers are simulated (torch.cuda.is_available patched): this
machine has no GPU."""

import pytest
import torch

from megatron_dapo.models import provider


def test_on_the_cpu_there_is_no_te_and_the_default_is_the_local_spec():
    assert not torch.cuda.is_available()
    assert provider.te_importable() is False
    assert provider.resolve_use_te(None) is False and provider.resolve_use_te(False) is False


def test_on_a_cuda_machine_without_te_scripts_get_local_and_the_trainer_refuses(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_te():
        raise ModuleNotFoundError("No module named 'transformer_engine'")

    monkeypatch.setattr(provider, "_import_te", no_te)
    assert provider.te_importable() is False  # gpu_dapo_step / gpu_feed_check then pass local
    with pytest.raises(RuntimeError, match="--transformer-impl local"):
        provider.resolve_use_te(None)  # the trainer: TE required on CUDA unless told otherwise
    assert provider.resolve_use_te(False) is False


def test_on_a_cuda_machine_with_te_both_choose_te(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(provider, "_import_te", lambda: None)
    assert provider.te_importable() is True
    assert provider.resolve_use_te(None) is True


@pytest.mark.parametrize("experts", [False, True], ids=["dense", "moe"])
def test_a_lora_model_on_te_gets_its_norms_unfused(monkeypatch, experts):
    """``layer_spec(use_te=True, unfuse_norms=True)`` (a LoRA model on a CUDA machine): the TE spec
    with the input norm and the pre-MLP norm as TE norms of their own before plain TE column-parallel
    linears (a MoE layer's pre-MLP norm is its own module already). TE does not import here: its
    spec is stood in by the local spec's structure and its two classes by markers."""
    import sys
    import types

    from megatron.core.models.gpt import gpt_layer_specs as specs

    te = types.ModuleType("megatron.core.extensions.transformer_engine")
    te.TEColumnParallelLinear, te.TENorm = type("TEColumnParallelLinear", (), {}), type("TENorm", (), {})
    monkeypatch.setitem(sys.modules, "megatron.core.extensions.transformer_engine", te)
    monkeypatch.setattr(provider, "_import_te", lambda: None)
    fused = type("TELayerNormColumnParallelLinear", (), {})

    def te_spec(num_experts=None, moe_grouped_gemm=False, qk_layernorm=False):
        spec = specs.get_gpt_layer_local_spec(
            num_experts=num_experts, qk_layernorm=qk_layernorm, normalization="RMSNorm"
        )
        spec.submodules.self_attention.submodules.linear_qkv = fused
        if not num_experts:
            provider.mlp_submodules(spec.submodules.mlp).linear_fc1 = fused
        return spec

    monkeypatch.setattr(specs, "get_gpt_layer_with_transformer_engine_spec", te_spec)
    from megatron_dapo.models import parse_hf_config
    from tests.tiny import tiny_qwen2_config, tiny_qwen3_moe_config

    arch = parse_hf_config(tiny_qwen3_moe_config() if experts else tiny_qwen2_config())
    kept = provider.layer_spec(use_te=True, arch=arch)
    assert kept.submodules.self_attention.submodules.linear_qkv is fused  # without LoRA: unchanged
    spec = provider.layer_spec(use_te=True, arch=arch, unfuse_norms=True)
    sub = spec.submodules
    assert sub.input_layernorm is te.TENorm
    assert sub.self_attention.submodules.linear_qkv is te.TEColumnParallelLinear
    if experts:
        assert sub.pre_mlp_layernorm is not te.TENorm  # the MoE layer's own norm, left as it is
    else:
        assert sub.pre_mlp_layernorm is te.TENorm
        assert provider.mlp_submodules(sub.mlp).linear_fc1 is te.TEColumnParallelLinear
