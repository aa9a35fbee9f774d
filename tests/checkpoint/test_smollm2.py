"""The real SmolLM2-135M-Instruct (9 heads, 3 KV heads, tied): HF vs megatron from torch_dist."""

import json
import os

import pytest
import torch

from tests.checkpoint import bodies

pytestmark = [pytest.mark.gloo, pytest.mark.slow]

N_NEW = 16


@pytest.fixture(scope="module")
def hf_reference(smollm2_hf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_hf)
    model = AutoModelForCausalLM.from_pretrained(smollm2_hf, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    tokens = torch.tensor([ids])
    with torch.no_grad():
        logits = model(tokens).logits
        seq = tokens
        for _ in range(N_NEW):  # plain greedy without cache or EOS stop, as the megatron side
            seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tok, ids, logits, seq[0, len(ids) :].tolist()


def test_greedy_text_is_sensible(hf_reference):
    """The GGUF q/k permutation is undone correctly: the model answers the question."""
    tok, _, _, new = hf_reference
    assert "Paris" in tok.decode(new)


def test_megatron_matches_hf(gloo, smollm2_hf, smollm2_ckpt, hf_reference):
    tok, ids, ref_logits, ref_new = hf_reference
    res = gloo(2).run(bodies.greedy, smollm2_hf, smollm2_ckpt, ids, N_NEW, timeout=600)[0]
    logits, new = res
    diff = float((logits - ref_logits).abs().max())
    print(f"SmolLM2 max |megatron - HF| logits = {diff:.3g}; greedy: {tok.decode(new)!r}")
    assert diff <= 1e-4, diff
    assert new == ref_new, (tok.decode(new), tok.decode(ref_new))


def test_export_with_tokenizer(gloo, smollm2_hf, smollm2_ckpt, hf_reference, tmp_path):
    """torch_dist -> HF with --hf-config/--tokenizer loads with from_pretrained offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = str(tmp_path / "hf")
    gloo(2).run(bodies.export_hf, smollm2_ckpt, out, "--hf-config", smollm2_hf, "--tokenizer", smollm2_hf, timeout=600)
    tok, ids, ref_logits, _ = hf_reference
    assert AutoTokenizer.from_pretrained(out)(["Paris"]).input_ids == tok(["Paris"]).input_ids
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["num_key_value_heads"] == 3 and cfg["tie_word_embeddings"] is True
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        assert torch.equal(model(torch.tensor([ids])).logits, ref_logits)


def test_prepare_is_idempotent(smollm2_hf):
    """A complete directory is returned as it is: no file is rewritten (no GGUF is read)."""
    before = {f: os.stat(os.path.join(smollm2_hf, f)).st_mtime_ns for f in os.listdir(smollm2_hf)}
    assert bodies.tool("prepare_smollm2").prepare(smollm2_hf) == smollm2_hf
    assert {f: os.stat(os.path.join(smollm2_hf, f)).st_mtime_ns for f in os.listdir(smollm2_hf)} == before
