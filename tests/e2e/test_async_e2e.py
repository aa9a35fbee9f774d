"""--async-mode one-step-off and bounded through ``megatron_dapo.train.main`` on the CPU
(HFEngine on Ray, a tiny random Qwen2): step n+1's rollout runs while step n trains, with the
weights before step n; every trained sample of steps 2.. is one version old and corrected by the
decoupled weight; bounded runs further ahead, never past --max-staleness, and survives an engine
killed while it generates ahead."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_train_e2e import base_args, read_metrics

pytestmark = [pytest.mark.slow]


def test_what_one_step_off_does_not_combine_with_is_refused_in_one_line():
    from megatron_dapo.config import ConfigError, parse_args, validate

    def refused(*extra, on_gpu=False):
        cfg = parse_args(["--hf-checkpoint", "x", "--async-mode", "one-step-off", *extra])
        with pytest.raises(ConfigError) as e:
            validate(cfg, on_gpu=on_gpu)
        return str(e.value)

    assert "add --rollout-placement disaggregated --rollout-num-gpus N" in refused(on_gpu=True)
    # disaggregated engines: their own GPUs, in whole engines, and no trainer offload
    assert "needs --rollout-num-gpus, a multiple of --rollout-num-gpus-per-engine 2 (got 3)" in refused(
        "--rollout-placement", "disaggregated", "--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "2"
    )
    assert "--rollout-num-gpus 4 gives the engines GPUs of their own: add --rollout-placement disaggregated" in (
        refused("--rollout-num-gpus", "4")
    )
    assert "drop it" in refused(
        "--rollout-placement", "disaggregated", "--rollout-num-gpus", "1", "--offload-train", "true"
    )
    assert "--partial-rollout is not built yet" in refused("--partial-rollout")
    assert "--reuse-surplus-groups is not built yet" in refused("--reuse-surplus-groups")


def test_the_trainer_offloads_by_default_only_for_colocated_engines_on_gpus():
    """``--offload-train`` unset: on for colocated engines on GPUs (they use the trainer's memory
    while they generate), off on the CPU and for engines on GPUs of their own; given, it wins."""
    from megatron_dapo.config import parse_args
    from megatron_dapo.config.validate import offload_train_default

    colocated = parse_args(["--hf-checkpoint", "x"])
    apart = parse_args(["--hf-checkpoint", "x", "--rollout-placement", "disaggregated", "--rollout-num-gpus", "8"])
    assert offload_train_default(colocated, on_gpu=True) is True
    assert offload_train_default(colocated, on_gpu=False) is False
    assert offload_train_default(apart, on_gpu=True) is False
    given = parse_args(["--hf-checkpoint", "x", "--offload-train", "true"])
    assert offload_train_default(given, on_gpu=False) is True


def test_one_step_off_and_the_ess_controller_that_holds_ess_above_its_threshold(tmp_path, capsys):
    """--async-mode one-step-off under --staleness-control ess on a real run. One-step-off itself:
    step 1 is on-policy; every step generated ahead trains only samples exactly one version old,
    every token corrected by the decoupled weight (whose spread is far above on-policy's). The
    controller: one-step-off's stale samples put ESS / N below the (deliberately strict)
    threshold every step, as the fixed lag would from step 2 on; it drops the lag to 0
    (on-policy) after such a step, regenerating the rollout it had queued, probes lag 1 again
    after 3 healthy steps, and most steps stay above the threshold."""
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run = str(tmp_path / "run")
    low, high = 0.9999, 0.99999  # a one-version lag at lr 1e-3 gives 1 - ESS/N ~ 1e-3; on-policy ~ 1e-12
    over = {
        "--async-mode": "one-step-off",
        "--staleness-control": "ess",
        "--staleness-ess-low": str(low),
        "--staleness-ess-high": str(high),
        "--num-rollout": "6",
        "--dump-rollouts-every": "0",
        "--tis-cap": "2",
    }
    assert main(base_args(hf, prompts, run, **over)) == 0
    rows = read_metrics(run)
    # one-step-off: the first step on-policy, the steps generated ahead exactly one version old
    assert rows[0]["sample_staleness_max"] == 0 and rows[0]["offpolicy_token_frac"] == 0.0
    spread = {r["step"]: r["is_weight_sq_mean"] - r["is_weight_mean"] ** 2 for r in rows}
    fresh_spread = max(spread[r["step"]] for r in rows if r["sample_staleness_max"] == 0)
    for r in rows:
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0, r
        if r["sample_staleness_max"] == 1:
            assert r["sample_staleness_mean"] == 1.0 and r["offpolicy_token_frac"] == 1.0, r  # all corrected
            # the weights were one update apart: the importance weights spread, where on-policy they are ~1
            assert spread[r["step"]] > 10 * max(fresh_spread, 1e-12), (spread, r["step"])
    with open(os.path.join(run, "config.json")) as f:
        assert json.load(f)["rollout"]["async_mode"] == "one-step-off"
    stale = [r["sample_staleness_max"] == 1 for r in rows]
    ess = [r["is_ess_frac"] for r in rows]
    assert all(e < low for e, s in zip(ess, stale) if s), list(zip(stale, ess))  # what the fixed lag gives
    assert all(e >= high for e, s in zip(ess, stale) if not s), list(zip(stale, ess))
    for r in rows:
        if r["is_ess_frac"] < low:
            assert r["staleness_lag"] == 0, r  # lowered at once
    above = sum(e >= low for e in ess) / len(ess)
    assert above >= 4 / 6 and 0 < sum(stale) < len(rows) - 1, (above, stale)  # fixed: only step 1 of 6
    # the rollout generated ahead at lag 1 when the lag dropped to 0 was thrown away and regenerated
    assert rows[-1]["async_regenerated_steps"] >= 1
    out = capsys.readouterr().out
    assert "[async] step 2: ESS/N" in out and "lag lowered to 0" in out and "lag raised to 1" in out, out[-2000:]


def test_bounded_on_engines_of_their_own_takes_broadcasts_while_generating_and_survives_an_engine_death(
    tmp_path, capsys
):
    """--async-mode bounded --max-staleness 2 with --rollout-placement disaggregated
    --rollout-num-gpus 1 and --proximal-logprobs interpolate. The engine runs on a bundle of its
    own, apart from the trainer's; every sync is a broadcast from trainer rank 0 over a gloo
    weight-update group the engine joins (hybrid/weight_broadcast.py, HFEngine's side of SGLang's
    calls), taken while the engine keeps generating ahead, and checked exactly (per-tensor
    checksums of the engine against what the trainer sent, and the probe). No trained sample is
    more than 2 versions old. The engine is killed in the middle of step 3's rollout, generated
    ahead while an earlier step trains: it is restarted and re-synced (a broadcast of its own)
    from the rollout thread after the trainer's running step, and the run completes. Samples of
    older weights get no proximal forward."""
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run = str(tmp_path / "run")
    over = {
        "--rollout-placement": "disaggregated",
        "--rollout-num-gpus": "1",
        "--async-mode": "bounded",
        "--max-staleness": "2",
        "--num-rollout": "4",
        "--debug-kill-engine-step": "3",
        "--proximal-logprobs": "interpolate",
        "--dump-rollouts-every": "0",
    }
    assert main(base_args(hf, prompts, run, **over)) == 0
    out = capsys.readouterr().out
    assert "[init] placement: disaggregated: 1 engine(s) on 1 GPU(s) of their own" in out
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["sample_staleness_max"] == 0  # step 1: the initial weights it trains
    skipped = 0
    for r in rows:
        assert r["weight_sync_checksums_compared"] > 0, r  # every tensor's bytes, engine vs trainer
        assert r["weight_sync_probe_diff"] < 1e-5 and r["sync_bytes"] > 0, r
        assert 0 <= r["sample_staleness_mean"] <= r["sample_staleness_max"] <= 2, r
        hist = {k: v for k, v in r.items() if k.startswith("staleness_lag") and k.endswith("_samples")}
        assert set(hist) <= {f"staleness_lag{k}_samples" for k in range(3)}, hist
        # interpolate: a forward for every sample with a token of the step's weights, none for the others
        assert hist.get("staleness_lag0_samples", 0) <= r["old_logprob_forward_samples"] <= sum(hist.values())
        skipped += sum(hist.values()) - r["old_logprob_forward_samples"]
    assert skipped > 0 and max(r["sample_staleness_max"] for r in rows) >= 1
    # restarted once (the requests it lost are counted in engine_resent_requests, 0 when the kill
    # came as the step's last requests were being aborted: tests/driver/test_streaming_manager.py)
    assert rows[-1]["engine_restarts"] == 1, [(r["engine_restarts"], r["engine_resent_requests"]) for r in rows]
    assert rows[-1]["async_regenerated_steps"] == 0  # a fixed lag throws nothing away
