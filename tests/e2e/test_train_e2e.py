"""End-to-end DAPO runs on the CPU: tiny random Qwen2, gloo ranks and HFEngine placed on Ray.

* TP2 and PP2: 3 DAPO steps each; the weight-sync probe passes at every sync; every
  metrics.jsonl key of the contract is there; one logged batch replayed on a single rank
  through the algorithm functions (transformers model, torch AdamW) gives the same update.
* Faults: the engine process is SIGKILLed mid-generation (restarted, re-synced, prompts
  re-queued) and a NaN loss is injected (exactly that step is skipped); this run also
  offloads the trainer between phases (--offload-train).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from megatron_dapo.driver.logging import REQUIRED_KEYS
from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.tolerances import COMPARE_ADAM_EPS, adam_weight_atol, max_abs

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return make_tiny_qwen2_dir(str(d / "hf")), make_prompts(str(d / "prompts.jsonl"))


def base_args(hf, prompts, run_dir, **over):
    args = {
        "--hf-checkpoint": hf,
        "--prompt-data": prompts,
        "--rollout-batch-size": "4",
        "--n-samples-per-prompt": "4",
        "--global-batch-size": "8",
        "--micro-batch-size": "4",
        "--max-response-length": "12",
        "--overlong-buffer-length": "4",
        "--max-prompt-length": "64",
        "--num-rollout": "3",
        "--lr": "1e-3",
        "--reward-fn": "tests.e2e.fixtures:parity_reward",
        "--run-dir": run_dir,
        "--wandb-mode": "disabled",
        "--reward-num-workers": "1",
        "--overlong-filter": "false",
        "--weight-sync-tolerance": "1e-5",
        "--dump-rollouts-every": "1",
        "--seed": "3",
    }
    args.update(over)
    out = []
    for k, v in args.items():
        out += [k] if v is None else [k, v]
    return out


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _replay(hf_dir, before, after, lr, weight_decay, clip, eps_low, eps_high, clip_c, adam_eps):
    """Single-rank replay: HF model + algorithm functions + torch AdamW, megatron's param groups."""
    from transformers import AutoModelForCausalLM

    from megatron_dapo.algo import aggregate_loss, policy_loss
    from megatron_dapo.checkpoint.mapping import megatron_to_hf
    from megatron_dapo.models import parse_hf_config

    arch = parse_hf_config(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    hf_before = {}
    for n, t in before["weights"].items():
        for hn, ht in megatron_to_hf(arch, n, t):
            hf_before[hn] = ht
    model.load_state_dict(hf_before, strict=False)
    params = dict(model.named_parameters())
    decay = [p for n, p in params.items() if p.dim() > 1]
    no_decay = [p for n, p in params.items() if p.dim() <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.999),
        eps=adam_eps,
    )
    samples, i = before["samples"], 0
    assert sum(before["minibatch_sizes"]) == len(samples), before["minibatch_sizes"]
    for n in before["minibatch_sizes"]:  # one optimizer step per mini-batch, as the trainer split them
        items = samples[i : i + n]
        i += n
        n_tok = float(sum(x.response_len for x in items if x.train))
        loss = 0.0
        for x in items:  # one TrainItem at a time: [1, response] rows
            logits = model(x.tokens[None]).logits.float()
            lp = (
                torch.log_softmax(logits[:, x.prompt_len - 1 : -1], -1)
                .gather(-1, x.tokens[None, x.prompt_len :, None])
                .squeeze(-1)
            )
            mask = torch.full_like(lp, 1.0 if x.train else 0.0)
            per_tok, _ = policy_loss(
                lp, x.old_logprobs[None], torch.tensor([x.advantage]), mask, eps_low, eps_high, clip_c
            )
            loss = loss + aggregate_loss(per_tok, mask, "token-mean", n_tok)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    got = {n: p.detach() for n, p in model.named_parameters()}
    worst = 0.0
    for n, t in after["weights"].items():
        for hn, ht in megatron_to_hf(arch, n, t):
            ref = got.get(hn, got.get("model.embed_tokens.weight") if hn == "lm_head.weight" else None)
            worst = max(worst, float((ref - ht).abs().max()))
    moved = max(float((after["weights"][n] - before["weights"][n]).abs().max()) for n in before["weights"])
    return worst, moved


def test_tp2_three_steps_probe_keys_and_replay(tiny, tmp_path):
    from megatron_dapo.train import main

    hf, prompts = tiny
    run = str(tmp_path / "run")
    dump = str(tmp_path / "dump")
    rc = main(
        base_args(
            hf,
            prompts,
            run,
            **{
                "--actor-num-gpus-per-node": "2",
                "--tensor-model-parallel-size": "2",
                "--debug-dump-train-batch": dump,
                "--weight-decay": "0.1",
                # the replay compares weights after Adam: its eps and
                # the bound below come from tests/tolerances.py
                "--lr": "1e-4",
                "--adam-eps": str(COMPARE_ADAM_EPS),
                "--eval-data": make_prompts(str(tmp_path / "prompts.jsonl"), 8),  # 8 problems
                "--eval-interval": "3",
                "--eval-k": "2",
                "--apply-chat-template": "false",
                "--save-hf-final": None,
            },
        )
    )
    assert rc == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        missing = [k for k in REQUIRED_KEYS if k not in r]
        assert not missing, missing
        assert r["weight_sync_probe_diff"] is not None and r["weight_sync_probe_diff"] < 1e-5
        assert r["train_infer_logprob_diff"] < 1e-4
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    assert os.path.exists(os.path.join(run, "rollouts", "step_000003.jsonl"))
    # --eval-interval 3: evaluated at step 3 only, logged as eval/<dataset>/<metric>
    assert "eval/prompts/avg@2" in rows[2] and "eval/prompts/pass@2" in rows[2]
    assert not any(k.startswith("eval/") for k in rows[0])
    assert os.path.getsize(os.path.join(run, "training_curves.png")) > 1000
    # replay step 1 (fresh optimizer state) on a single rank through the algorithm functions
    before = torch.load(os.path.join(dump, "step_000001_before.pt"), weights_only=False)
    after = torch.load(os.path.join(dump, "step_000001_after.pt"), weights_only=False)
    worst, moved = _replay(
        hf,
        before,
        after,
        lr=1e-4,
        weight_decay=0.1,
        clip=1.0,
        eps_low=0.2,
        eps_high=0.28,
        clip_c=10.0,
        adam_eps=COMPARE_ADAM_EPS,
    )
    assert moved > 5e-5  # the step really changed the weights (2 Adam steps of up to lr each)
    # two Adam steps of an HF model against megatron's (kernels and reduction orders differ)
    atol = adam_weight_atol(1e-4, rows[0]["grad_norm"], max_abs(before["weights"]), steps=2, clip_grad=1.0)
    assert worst <= atol, (worst, atol)
    # --save-hf-final: the trainer's final weights (not an engine's) through the one mapping
    from safetensors.torch import load_file

    from megatron_dapo.checkpoint.mapping import megatron_to_hf
    from megatron_dapo.models import parse_hf_config

    final = load_file(os.path.join(run, "final_hf", "model.safetensors"))
    last = torch.load(os.path.join(dump, "step_000003_after.pt"), weights_only=False)["weights"]
    arch = parse_hf_config(hf)
    want = {hn: ht for n, t in last.items() for hn, ht in megatron_to_hf(arch, n, t)}
    assert final.keys() == want.keys()
    assert all(torch.equal(final[k], want[k]) for k in want)


def test_pp2_engine_kill_nan_step_and_kl_to_reference(tiny, tmp_path):
    """PP 2 with the trainer offloaded: an engine killed mid-generation (step 2), a NaN loss
    (step 3), and --kl-coef > 0, which builds a frozen reference (the initial weights, on both
    pipeline stages) and adds the KL term."""
    from megatron_dapo.train import main

    hf, prompts = tiny
    run = str(tmp_path / "run")
    rc = main(
        base_args(
            hf,
            prompts,
            run,
            **{
                "--actor-num-gpus-per-node": "2",
                "--pipeline-model-parallel-size": "2",
                "--debug-kill-engine-step": "2",
                "--debug-inject-nan-step": "3",
                "--num-rollout": "4",
                "--offload-train": "true",
                "--kl-coef": "0.05",
                "--kl-estimator": "k3",
            },
        )
    )
    assert rc == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    by = {r["step"]: r for r in rows}
    # KL: step 1 starts at the reference (first optimizer step: KL 0), then the policy moves away
    assert 0.0 <= by[1]["kl"] < by[2]["kl"] and math.isfinite(by[2]["kl"]) and by[2]["kl"] > 1e-8
    # the engine was killed mid-generation at step 2: restarted once, the step completed
    assert by[1]["engine_restarts"] == 0 and by[2]["engine_restarts"] == 1 and by[4]["engine_restarts"] == 1
    for r in rows:
        assert r["weight_sync_probe_diff"] < 1e-5  # re-synced engine has the trainer's weights
        assert not [k for k in REQUIRED_KEYS if k not in r]
    # the NaN loss skipped exactly step 3
    assert by[3]["skipped_optimizer_steps"] == by[3]["optimizer_steps"] >= 1
    assert all(by[s]["skipped_optimizer_steps"] == 0 for s in (1, 2, 4))
    assert math.isfinite(by[4]["grad_norm"])
    assert all(r["dp_token_imbalance"] == 1.0 for r in rows)  # one DP rank: balanced by definition
    # the driver's phase order (hybrid/phases.py HybridStep over the Ray cluster), offload on
    step = [
        "engine_release",
        "trainer_onload",
        "engine_resume_weights",
        "sync_weights",
        "probe_megatron",
        "trainer_offload",
        "engine_resume_kv_cache",
        "probe_engine",
    ]
    with open(os.path.join(run, "hybrid_events.jsonl")) as f:
        events = {r["step"]: r["events"] for r in map(json.loads, f)}
    # start-up: the engines launch and release their memory before the trainer is built; the
    # first sync fills the engine built without weights
    assert events[0] == ["engine_launch_release", "trainer_build"] + step[2:]
    assert events[1] == events[3] == events[4] == step
    # step 2: the killed engine was restarted mid-rollout and re-synced with the trainer onloaded
    # only while the engines' KV caches were released
    assert (
        events[2]
        == [
            "engine_release_kv_cache",
            "trainer_onload",
            "sync_weights",
            "probe_megatron",
            "trainer_offload",
            "engine_resume_kv_cache",
            "probe_engine",
        ]
        + step
    )
