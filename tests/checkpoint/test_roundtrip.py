"""HF -> torch_dist (tools/convert_hf_to_megatron.py) -> loaded at TP1/TP2/PP2/TP2xPP2 gives
the HF logits; torch_dist -> HF (tools/convert_megatron_to_hf.py) gives the same tensors."""

import pytest
import torch

from tests.checkpoint import bodies
from tests.checkpoint.conftest import TINY

pytestmark = [pytest.mark.gloo]

LAYOUTS = [(1, 1, 2), (2, 1, 2), (1, 2, 2), (2, 2, 4)]


def hf_logits(hf_dir, tokens):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def tokens_for(name):
    g = torch.Generator().manual_seed(11)
    return torch.randint(0, TINY[name]["vocab_size"], (2, 10), generator=g)


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("tp,pp,world", LAYOUTS, ids=[f"tp{t}pp{p}" for t, p, _ in LAYOUTS])
def test_checkpoint_logits_equal_hf(gloo, tiny_hf, tiny_ckpt, name, tp, pp, world):
    tokens = tokens_for(name)
    ref = hf_logits(tiny_hf[name], tokens)
    got = [
        g
        for g in gloo(world).run(bodies.checkpoint_logits, TINY[name], tiny_ckpt[name], tp, pp, tokens)
        if g is not None
    ]
    assert got, "no rank returned logits"
    for g in got:
        assert g.shape == ref.shape
        assert float((g - ref).abs().max()) < 1e-5


def read_safetensors_dir(path):
    import glob

    from safetensors.torch import load_file

    out = {}
    for f in sorted(glob.glob(f"{path}/*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.parametrize("name", list(TINY))
def test_torch_dist_to_hf_bit_identical(gloo, tiny_hf, tiny_ckpt, tmp_path, name):
    out = str(tmp_path / "hf")
    gloo(2).run(bodies.export_hf, tiny_ckpt[name], out, "--max-shard-size-gb", str(40e3 / 1024**3))
    src, got = read_safetensors_dir(tiny_hf[name]), read_safetensors_dir(out)
    assert set(got) == set(src) - ({"lm_head.weight"} if TINY[name]["tie_word_embeddings"] else set())
    for k in got:
        assert got[k].dtype == src[k].dtype and torch.equal(got[k], src[k]), k
    import json
    import os

    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    assert set(index["weight_map"]) == set(got) and len(set(index["weight_map"].values())) > 1
    tokens = tokens_for(name)
    assert torch.equal(hf_logits(out, tokens), hf_logits(tiny_hf[name], tokens))


def test_bf16_checkpoint(gloo, tiny_hf, tmp_path):
    """--dtype bf16 stores bf16; it loads into an fp32 model at TP2 and exports bf16 tensors."""
    ck, out = str(tmp_path / "ck"), str(tmp_path / "hf")
    gloo(2).run(bodies.convert_hf, tiny_hf["qwen2"], ck, "bf16")
    gloo(2).run(bodies.export_hf, ck, out)
    src, got = read_safetensors_dir(tiny_hf["qwen2"]), read_safetensors_dir(out)
    for k in got:
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], src[k].to(torch.bfloat16)), k
    tokens = tokens_for("qwen2")
    ref = hf_logits(out, tokens)  # bf16 weights, run in fp32
    got = [g for g in gloo(2).run(bodies.checkpoint_logits, TINY["qwen2"], ck, 2, 1, tokens) if g is not None]
    assert float((got[0] - ref).abs().max()) < 1e-5


def test_tied_vocab_repad_tp2pp2(gloo, tmp_path):
    """Tied embeddings + a vocabulary padded differently at TP2 (300 -> 384 at TP1, 512 at TP2):
    the embedding (first stage) and the tied output layer (last stage) both re-pad."""
    from tests.checkpoint.conftest import write_hf
    from tests.tiny import tiny_llama_config

    cfg = tiny_llama_config(vocab_size=300)
    hf_dir, ck = write_hf(cfg, tmp_path / "hf", seed=3), str(tmp_path / "ck")
    gloo(4).run(bodies.convert_hf, hf_dir, ck, "fp32")
    tokens = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(5))
    ref = hf_logits(hf_dir, tokens)
    got = [g for g in gloo(4).run(bodies.checkpoint_logits, cfg, ck, 2, 2, tokens) if g is not None]
    assert got and all(float((g - ref).abs().max()) < 1e-5 for g in got)


def test_a_save_leaves_no_server_process_behind(gloo, tiny_hf, tmp_path):
    """platform.py patch 12: megatron-core's write results stay in the rank (a ``queue.Queue``), so
    a save starts no multiprocessing Manager (a server process that re-ran the rank's
    ``__main__`` and lived as long as the rank); the checkpoint still loads bit-exactly. A pool's
    ranks live for the session, so the deprecation line is checked where this is their first save
    (run alone or first); it is dropped from megatron-core's logger either way."""
    ck = str(tmp_path / "ck")
    got = gloo(2).run(bodies.save_and_list_children, tiny_hf["qwen2"], ck)
    for g in got:
        assert g["rc"] == 0 and g["queue"] == "queue", g
        assert not [c for c in g["children"] if "multiprocessing" in c], g["children"]
        # 0.19 logs an async-save deprecation at a process's first save, synchronous or not
        assert not [m for m in g["logged"] if "async save is deprecated" in m], g["logged"]
    out = str(tmp_path / "hf")
    gloo(2).run(bodies.export_hf, ck, out)
    src, back = read_safetensors_dir(tiny_hf["qwen2"]), read_safetensors_dir(out)
    assert set(back) and all(torch.equal(back[k], src[k]) for k in back)
