"""One real DAPO step of the trainer's own code in ONE process (run by benchmarks/gpu_check.sh).

What runs is what ``python -m megatron_dapo.train`` runs on every rank, minus Ray: a
``PolicyWorker`` (megatron-core policy, bf16 on a GPU), an ``HFEngine`` on the same device,
and the ONE hybrid step (``hybrid.phases.HybridStep`` with ``InProcessTrainer``):

  init      the engine is built without weights; HybridStep.to_rollout syncs them in, probes
  generate  G samples of a few prompts from the engine (tempered sampling)
  to_train  the engine releases weights + KV cache, the trainer onloads
  old lp    PolicyWorker.compute_logprobs (megatron, at the rollout temperature)
  train     group advantages + one DAPO optimizer step (PolicyWorker.train)
  sync      HybridStep.to_rollout: resume weights, bucketed sync, probe at the parameter
            dtype's tolerance (bf16: 0.25), offload the trainer, resume the KV cache
  generate  again, with the new weights

One line per stage (``[dapo-step] stage ... s``); exit code 0 when every stage passed.

    python benchmarks/gpu_dapo_step.py                 # GPU (bf16, NCCL world of one)
    python benchmarks/gpu_dapo_step.py --small         # CPU smoke run (fp32, gloo), used by a test
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def tiny_hf_dir(out: str, small: bool, vocab: int = 0, tokenizer: str = None) -> str:
    """A random Qwen2 HF config (no weights needed: the trainer initialises, the sync fills the
    engine); with ``tokenizer``, its files are copied in (SGLang needs one)."""
    h, f, layers, nh, nkv, v = (64, 128, 2, 4, 2, 512) if small else (1024, 2816, 4, 16, 2, 32768)
    vocab = vocab or v
    cfg = dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=f,
        num_hidden_layers=layers,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        hidden_act="silu",
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f_:
        json.dump(cfg, f_)
    if tokenizer:
        from megatron_dapo.checkpoint.hf_export import copy_tokenizer

        copy_tokenizer(tokenizer, out)
    return out


def make_engine(kind: str, hf: str, dtype, device, tp: int = 1):
    """The rollout engine under test: HFEngine on ``device``, or SGLangEngine (GPU, sglang installed)."""
    if kind == "hf":
        from transformers import AutoConfig

        from megatron_dapo.rollout.hf_engine import HFEngine

        return HFEngine(AutoConfig.from_pretrained(hf), dtype=dtype, device=device, seed=1)
    from megatron_dapo.rollout.sglang_engine import SGLangEngine

    return SGLangEngine(
        hf, tp_size=tp, mem_fraction_static=0.3, enable_memory_saver=True, dtype="bfloat16", random_seed=1
    )


def run(
    small: bool = False, port: int = 0, log=print, engine_kind: str = "hf", tokenizer: str = None, vocab: int = 0
) -> dict:
    """One hybrid DAPO step on a tiny model written to a temporary directory (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="dapo_step_hf_") as tmp:
        return _run(tmp, small, port, log, engine_kind, tokenizer, vocab)


def _run(tmp: str, small: bool, port: int, log, engine_kind: str, tokenizer, vocab: int) -> dict:
    import torch

    from megatron_dapo.algo import compute_group_advantages
    from megatron_dapo.config import parse_args
    from megatron_dapo.distributed import free_port, init_distributed
    from megatron_dapo.hybrid.phases import HybridStep, InProcessTrainer, LocalEngines
    from megatron_dapo.rollout.base import SamplingParams
    from megatron_dapo.training.item import TrainItem
    from megatron_dapo.training.worker import PolicyWorker

    on_gpu = torch.cuda.is_available() and not small
    stages = {}

    def stage(name, t0, **info):
        stages[name] = time.perf_counter() - t0
        extra = " ".join(f"{k}={v}" for k, v in info.items())
        log(f"[dapo-step] {name:10s} {stages[name]:7.2f} s {extra}")

    hf = tiny_hf_dir(tmp, small=not on_gpu, vocab=vocab, tokenizer=tokenizer)
    G, prompts_n, new = 4, 2, 8
    flags = [
        "--hf-checkpoint",
        hf,
        "--micro-batch-size",
        "4",
        "--global-batch-size",
        str(G * prompts_n),
        "--rollout-batch-size",
        str(prompts_n),
        "--n-samples-per-prompt",
        str(G),
        "--lr",
        "1e-4",
        "--rollout-temperature",
        "0.9",
        "--update-weight-buffer-size",
        str(8 * 1024 * 1024),
    ]
    if on_gpu:
        flags.append("--bf16")
    # the lent H200 has no Transformer Engine: the local layer spec there (the trainer itself
    # refuses to fall back silently; this check says which spec it ran)
    from megatron_dapo.models.provider import te_importable

    impl = "transformer_engine" if te_importable() else "local"
    flags += ["--transformer-impl", impl]
    log(f"layer spec: --transformer-impl {impl}")
    cfg = parse_args(flags)
    init_distributed(rank=0, world_size=1, master_port=port or free_port())
    t0 = time.perf_counter()
    worker = PolicyWorker(0, 1, "127.0.0.1", 0, cfg, hf)
    # megatron's own (random) initial weights: the engine gets them through the first sync
    dtype = torch.bfloat16 if on_gpu else torch.float32
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    engine = make_engine(engine_kind, hf, dtype, device)
    engines = LocalEngines([engine])
    hybrid = HybridStep(
        InProcessTrainer(worker, offload=True), offload=True, check_weight_sync_every=1, param_dtype=dtype
    )
    stage(
        "build",
        t0,
        engine=type(engine).__name__,
        device=device,
        dtype=str(dtype).replace("torch.", ""),
        tolerance=hybrid.tolerance,
    )

    g = torch.Generator().manual_seed(5)
    vocab = json.load(open(os.path.join(hf, "config.json")))["vocab_size"]
    prompts = [torch.randint(3, vocab, (6,), generator=g).tolist() for _ in range(prompts_n)]
    t0 = time.perf_counter()
    info = hybrid.to_rollout(engines, probe=[prompts[0] + prompts[1]])
    stage("init-sync", t0, bytes=info["sync"].get("bytes"), probe=f"{info['probe_max_abs']:.3g}")

    sp = SamplingParams(temperature=0.9, top_p=1.0, max_new_tokens=new, n=G, seed=7, ignore_eos=True)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, sp)
    stage("generate", t0, samples=sum(len(o) for o in outs))

    t0 = time.perf_counter()
    hybrid.to_train(engines)
    stage("to-train", t0)

    samples = []
    for p, group in zip(prompts, outs):
        for o in group:
            samples.append(TrainItem(tokens=p + list(o.output_ids), prompt_len=len(p)))
    rewards = torch.tensor([float(s.tokens[-new:].sum()) % 2 for s in samples]).view(prompts_n, G)
    if bool((rewards.sum(1) % G == 0).all()):  # make every group mixed (any labels will do here)
        rewards[:, 0] = 1 - rewards[:, 0]
    adv = compute_group_advantages(rewards.view(-1), G)
    t0 = time.perf_counter()
    old = worker.compute_logprobs(samples)
    stage("old-logprob", t0, tokens=sum(len(x) for x in old))
    samples = [replace(s, old_logprobs=lp, advantage=a) for s, lp, a in zip(samples, old, adv.tolist())]

    t0 = time.perf_counter()
    out = worker.train([samples])[0]
    stage("train", t0, ok=out.update_successful, grad_norm=f"{out.grad_norm:.4g}")
    if not out.update_successful:
        raise RuntimeError("the optimizer step was skipped (non-finite loss or gradient)")

    t0 = time.perf_counter()
    info = hybrid.to_rollout(engines, probe=[samples[0].tokens.tolist()])
    chk = hybrid.last_check  # the weight-sync check: exact checksums by HF name, then mean/p90 of the probe
    stage(
        "sync+probe",
        t0,
        bytes=info["sync"].get("bytes"),
        probe=f"{info['probe_max_abs']:.3g}",
        checksums=chk.get("compared", "n/a"),
        mean=f"{chk.get('mean_abs', float('nan')):.3g}",
        p90=f"{chk.get('p90_abs', float('nan')):.3g}",
        events=",".join(hybrid.events[-6:]),
    )

    t0 = time.perf_counter()
    again = engine.generate(prompts, sp)
    stage("generate", t0, samples=sum(len(o) for o in again))
    t0 = time.perf_counter()
    scored = engine.score([samples[0].tokens.tolist()], [samples[0].prompt_len])
    stage("score", t0, tokens=len(scored[0]))
    if engine_kind != "hf":
        engine.shutdown()
    return {
        "stages": stages,
        "probe": info["probe_max_abs"],
        "tolerance": hybrid.tolerance,
        "events": list(hybrid.events),
        "update_successful": out.update_successful,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="CPU smoke run (fp32, gloo)")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")
    return report(lambda: run(small=args.small, port=args.port), "dapo-step")


def report(step, tag: str) -> int:
    """Run ``step()``; print ``[tag] PASS probe ...`` or the traceback and ``[tag] FAIL``."""
    try:
        res = step()
    except Exception:
        import traceback

        traceback.print_exc()
        print(f"[{tag}] FAIL")
        return 1
    print(f"[{tag}] PASS probe {res['probe']:.3g} <= tolerance {res['tolerance']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
