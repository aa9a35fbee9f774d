"""Gloo-rank bodies for the trainer's GPU-first-contact tests (module-level: they pickle by name)."""

from __future__ import annotations

import torch

from megatron_dapo.training.item import TrainItem


def tempered_logprobs_vs_hf(hf_cfg: dict, tp: int, temperature: float):
    """compute_logprobs / entropy at ``temperature`` vs log_softmax(HF logits / T) (last stage)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.training.dapo_step import compute_logprobs
    from megatron_dapo.training.forward import forward_backward
    from megatron_dapo.training.logprobs import chunked_logprobs_entropy
    from tests.foundation.bodies import build_from_hf

    hf, model, arch, _ = build_from_hf(hf_cfg, tp, 1)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, arch.vocab_size, (n,), generator=g).tolist() for n in (9, 6)]
    samples = [TrainItem(tokens=s, prompt_len=3) for s in seqs]
    got = compute_logprobs(model, samples, arch.vocab_size, micro_batch_size=2, temperature=temperature)
    ents = []

    def loss_fn(batch, logits):
        target = torch.zeros(logits.shape[:-1], dtype=torch.long)  # the entropy does not depend on it
        ents.append(chunked_logprobs_entropy(logits, target, arch.vocab_size, temperature)[1].detach())
        return logits.sum() * 0, {}

    with torch.no_grad():
        forward_backward(model, [{"tokens": torch.tensor([seqs[0]])}], loss_fn, forward_only=True)
    if not ps.is_pipeline_last_stage():
        return None
    lp_err, ent_err = 0.0, 0.0
    with torch.no_grad():
        for s, mine in zip(seqs, got):
            logits = hf(torch.tensor([s])).logits[0].double() / temperature
            ref = torch.log_softmax(logits, -1)
            want = [float(ref[t - 1, s[t]]) for t in range(3, len(s))]
            lp_err = max(lp_err, max(abs(a - b) for a, b in zip(mine, want)))
        logits = hf(torch.tensor([seqs[0]])).logits[0].double() / temperature
        p = torch.softmax(logits, -1)
        ent_ref = -(p * torch.log_softmax(logits, -1)).sum(-1)
        ent_err = float((ents[0][0].double() - ent_ref).abs().max())
    return {"logprob": lp_err, "entropy": ent_err, "n": [len(x) for x in got]}


def sequence_parallel_padding(hf_cfg: dict, tp: int):
    """The sequences of a model whose config says sequence_parallel are padded to a multiple of TP."""
    from megatron_dapo.checkpoint.model_io import unwrap
    from megatron_dapo.training.dapo_step import make_microbatches, pad_multiple_of
    from tests.foundation.bodies import build_from_hf

    _, model, _, _ = build_from_hf(hf_cfg, tp, 1)
    plain = pad_multiple_of(model)
    unwrap(model).config.sequence_parallel = True
    sp = pad_multiple_of(model)
    samples = [TrainItem(tokens=list(range(1, n + 1)), prompt_len=2) for n in (5, 7, 9)]
    lens = [mb["seqlens_padded"] for mb in make_microbatches(model, samples, 2, None)[0]]
    return {"plain": plain, "sp": sp, "lens": lens}


def export_hf_roundtrip(hf_cfg: dict, tp: int, pp: int, out_dir: str, max_shard_bytes: int):
    """Export the megatron model (loaded from random HF weights) and compare with those weights."""
    import torch.distributed as dist

    from megatron_dapo.checkpoint.hf_export import export_model_to_hf
    from tests.foundation.bodies import build_from_hf

    hf, model, arch, _ = build_from_hf(hf_cfg, tp, pp)
    written = export_model_to_hf(model, arch, out_dir, hf_config_dir=hf_cfg, max_shard_bytes=max_shard_bytes)
    if dist.get_rank() != 0:
        return None
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(out_dir, torch_dtype=torch.float32)
    ref = hf.state_dict()
    got = back.state_dict()
    diffs = {n: float((got[n] - t).abs().max()) for n, t in ref.items() if n in got}
    return {
        "written": written,
        "missing": sorted(set(ref) - set(got)),
        "max_diff": max(diffs.values()),
        "n": len(diffs),
    }
