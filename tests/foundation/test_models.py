"""HF config -> megatron model description: supported families, clear errors otherwise."""

import subprocess
import sys

import pytest

from megatron_dapo.models import ModelConfigError, parse_hf_config
from tests.tiny import tiny_llama_config, tiny_qwen2_config


def test_qwen2_and_llama_fields():
    q = parse_hf_config(tiny_qwen2_config(rope_parameters={"rope_theta": 1e6, "rope_type": "default"}))
    assert q.qkv_bias and not q.tie_word_embeddings and q.num_query_groups == 2 and q.rope_theta == 1e6
    ll = parse_hf_config(tiny_llama_config())
    assert not ll.qkv_bias and ll.tie_word_embeddings and ll.norm_eps == 1e-5


def test_qwen25_32b_shape_from_examples():
    from pathlib import Path

    p = Path(__file__).resolve().parents[2] / "examples" / "qwen2.5-32b" / "config.json"
    a = parse_hf_config(p)
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads, a.num_query_groups) == (
        64,
        5120,
        27648,
        40,
        8,
    )
    assert a.vocab_size == 152064 and not a.tie_word_embeddings and a.num_parameters == 32_763_876_352


@pytest.mark.parametrize(
    "override,field",
    [
        ({"model_type": "mistral"}, "model_type"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "rope_type"),
    ],
)
def test_unsupported_fields_named(override, field):
    with pytest.raises(ModelConfigError, match=field):
        parse_hf_config(tiny_qwen2_config(**override))


def test_llama_attention_bias_refused():
    with pytest.raises(ModelConfigError, match="attention_bias"):
        parse_hf_config(tiny_llama_config(attention_bias=True))


def test_missing_field_named():
    cfg = tiny_qwen2_config()
    del cfg["num_hidden_layers"]
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        parse_hf_config(cfg)


def test_config_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        parse_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="config.json"):
        parse_hf_config(tmp_path)


def test_import_is_light():
    """`import megatron_dapo` (and its config) never imports sglang, transformer_engine or megatron."""
    code = (
        "import sys, megatron_dapo, megatron_dapo.config, megatron_dapo.models, megatron_dapo.rollout;"
        "bad=[m for m in ('sglang','transformer_engine','megatron.core') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------- layer spec: --transformer-impl ----
def _cuda_without_te(monkeypatch):
    """A CUDA machine (as far as the spec choice asks) whose transformer_engine fails to import."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # `import transformer_engine` raises ImportError


def test_failed_te_import_on_cuda_is_an_error_naming_it(monkeypatch):
    from megatron_dapo.models.provider import layer_spec

    _cuda_without_te(monkeypatch)
    with pytest.raises(RuntimeError) as e:
        layer_spec()  # the default: --transformer-impl transformer_engine
    msg = str(e.value)
    assert "Transformer Engine does not import" in msg and "import of transformer_engine halted" in msg
    assert "--transformer-impl local" in msg
    assert isinstance(e.value.__cause__, ImportError)


def test_transformer_impl_local_selects_the_local_spec(monkeypatch):
    from megatron_dapo.config.cli import parse_args
    from megatron_dapo.models.attention import PackedDotProductAttention
    from megatron_dapo.models.provider import layer_spec, use_te_for

    assert parse_args([]).model.transformer_impl == "transformer_engine" and use_te_for("transformer_engine") is None
    impl = parse_args(["--transformer-impl", "local"]).model.transformer_impl
    assert impl == "local"
    _cuda_without_te(monkeypatch)
    spec = layer_spec(use_te_for(impl))
    assert spec.submodules.self_attention.submodules.core_attention is PackedDotProductAttention


def test_the_worker_reads_transformer_impl():
    # The flag is read where the trainer's model is built (a flag exists only if it is read).
    import inspect

    from megatron_dapo.training import worker

    assert "use_te=use_te_for(cfg.model.transformer_impl)" in inspect.getsource(worker)


def test_local_impl_refuses_sequence_parallel():
    from megatron_dapo.config.cli import parse_args
    from megatron_dapo.config.validate import ConfigError, validate

    cfg = parse_args(
        [
            "--transformer-impl",
            "local",
            "--sequence-parallel",
            "--tensor-model-parallel-size",
            "2",
            "--actor-num-gpus-per-node",
            "2",
            "--max-prompt-length",
            "16",
            "--max-response-length",
            "32",
        ]
    )
    with pytest.raises(ConfigError, match="--sequence-parallel needs --transformer-impl transformer_engine"):
        validate(cfg, parse_hf_config(tiny_qwen2_config()), on_gpu=True)
