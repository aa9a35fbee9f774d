"""The initial weight-sync check (``--check-weight-sync-init``): the engine starts from the
checkpoint, records it ("snapshot"), is overwritten with random values ("reset_tensors")
before the first sync, and after it every tensor must equal its record ("compare").

* SGLangEngine against the pinned wheel's OWN code on the CPU (tests/rollout/sglang_wheel.py):
  the adapter's request goes through ``TokenizerControlMixin.check_weights`` -> each TP rank's
  ``SchedulerWeightUpdaterManager.check_weights`` (checksums all-gathered over the TP ranks) ->
  ``ModelRunner.check_weights`` -> ``WeightChecker`` (its "checksum" and "reset_tensors");
* HFEngine, the same protocol on its HF tensors;
* both under ``HybridStep`` (launch -> first ``to_rollout``): a sync of the checkpoint passes;
  a sync whose loader skips a tensor, or that exchanges two tensors, fails naming them.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from megatron_dapo.hybrid.phases import HybridStep, LocalEngines
from megatron_dapo.hybrid.probe import compare_checksums
from megatron_dapo.hybrid.weight_sync import WeightSyncError
from megatron_dapo.rollout import sglang_engine as se
from megatron_dapo.rollout.base import MEMORY_TAGS, WEIGHTS, EngineReleasedError, SamplingParams
from megatron_dapo.rollout.checksum import tensor_checksum
from megatron_dapo.rollout.hf_engine import HFEngine
from tests.rollout.helpers import PROMPTS, qwen2_config, random_model
from tests.rollout.test_sglang_protocol import WheelEngine, src, wheel_modules, wheel_sglang  # noqa: F401 (fixtures)

Q0 = "model.layers.0.self_attn.q_proj.weight"
Q1 = "model.layers.1.self_attn.q_proj.weight"
SKIPPED = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture
def ckpt(tmp_path):
    """An HF checkpoint directory and the tensors a trainer at step 0 sends (its weights)."""
    model = random_model(qwen2_config())
    model.save_pretrained(tmp_path)
    sd = [(k, v.clone()) for k, v in model.state_dict().items() if k != "lm_head.weight"]  # tied
    return tmp_path, sd


def _swapped(sd):
    d = dict(sd)
    return [(n, d[Q1] if n == Q0 else d[Q0] if n == Q1 else t) for n, t in sd]


def _sglang(model_dir, tp):
    eng = se.SGLangEngine(str(model_dir), tp_size=tp, load_format="auto", device="cuda")
    return eng, WheelEngine.instances[-1]


# ------------------------------------------------------------- SGLang through the wheel ----
@pytest.mark.parametrize("tp", [1, 2])
def test_sglang_check_weights_goes_through_sglangs_weight_checker(wheel_sglang, ckpt, tp):
    model_dir, sd = ckpt
    eng, fake = _sglang(model_dir, tp)
    assert fake.kwargs["load_format"] == "auto"  # the checkpoint's weights, not random ones
    assert eng.check_weights("snapshot") == []
    assert fake.calls[-1] == ("check_weights", "checksum", "target")
    # every rank ran the checker; the entry rank's answer carries every rank's checksums
    assert all(a.success for a in fake.answers) and len(fake.answers[0].payload) == tp
    before = dict(eng._checksum_snapshot)
    assert sorted(before) == [f"tp rank {r}" for r in range(tp)]
    assert set(before["tp rank 0"]) >= {Q0, Q1, SKIPPED, "model.embed_tokens.weight"}
    assert not any("inv_freq" in n for n in before["tp rank 0"])  # SGLang skips derived buffers

    eng.release_memory(MEMORY_TAGS)
    eng.resume_memory([WEIGHTS])
    assert eng.check_weights("reset_tensors") == []
    assert fake.calls[-1] == ("check_weights", "reset_tensors", "target")
    w = fake.hf.get_weight(Q0)
    assert 0 <= float(w.min()) and float(w.max()) < 1  # SGLang's random fill: uniform [0, 1)

    eng.update_weights(sd)
    eng.finish_weight_update()
    assert eng.check_weights("compare") == []
    assert fake.calls[-1] == ("check_weights", "checksum", "target")
    with pytest.raises(RuntimeError, match="without a snapshot"):
        eng.check_weights("compare")  # the snapshot is used once


def _first_sync_diffs(eng, sd):
    eng.check_weights("snapshot")
    eng.release_memory(MEMORY_TAGS)
    eng.resume_memory([WEIGHTS])
    eng.check_weights("reset_tensors")
    eng.update_weights(sd)
    eng.finish_weight_update()
    return eng.check_weights("compare")


def test_sglang_check_names_a_tensor_its_loader_skipped(wheel_sglang, ckpt):
    model_dir, sd = ckpt
    eng, fake = _sglang(model_dir, 2)
    load = fake.model.load_weights
    # SGLang's load_weights skips names it does not map (``if name not in params_dict: continue``)
    fake.model.load_weights = lambda named: load([(n, t) for n, t in named if n != SKIPPED])
    assert _first_sync_diffs(eng, sd) == [f"{SKIPPED}: hash differs on tp rank 0, tp rank 1"]


def test_sglang_check_names_two_exchanged_tensors(wheel_sglang, ckpt):
    model_dir, sd = ckpt
    eng, _ = _sglang(model_dir, 1)
    diffs = _first_sync_diffs(eng, _swapped(sd))
    assert diffs == [f"{Q0}: hash differs on tp rank 0", f"{Q1}: hash differs on tp rank 0"]


def test_sglang_check_needs_weights_and_known_actions(wheel_sglang, ckpt):
    eng, fake = _sglang(ckpt[0], 1)
    with pytest.raises(ValueError, match="unknown weight check action"):
        eng.check_weights("checksum")
    sp = SamplingParams(max_new_tokens=2)
    eng.generate(PROMPTS, sp)  # the checkpoint's weights
    eng.check_weights("reset_tensors")
    with pytest.raises(EngineReleasedError, match="weight update"):
        eng.generate(PROMPTS, sp)  # random weights until the next complete sync
    eng.release_memory([WEIGHTS])
    n = len(fake.calls)
    with pytest.raises(EngineReleasedError, match="check_weights"):
        eng.check_weights("snapshot")
    assert len(fake.calls) == n + 0  # nothing reached SGLang


# ----------------------------------------------------------------- pure functions ----
def test_sglang_names_map_to_the_hf_tensors_written_into_them():
    assert se.hf_sources("model.layers.3.self_attn.qkv_proj.weight") == [
        "model.layers.3.self_attn.q_proj.weight",
        "model.layers.3.self_attn.k_proj.weight",
        "model.layers.3.self_attn.v_proj.weight",
    ]
    assert se.hf_sources("model.layers.0.mlp.gate_up_proj.weight") == [
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]
    assert se.hf_sources("model.norm.weight") == ["model.norm.weight"]


def test_rank_checksums_diff():
    def info(tp_rank, sums, dp=(0, 1)):
        return {
            "checksums": sums,
            "per_gpu_checksum": "x",
            "parallelism_info": [
                {
                    "role": "target",
                    "tp_rank": tp_rank,
                    "tp_size": 2,
                    "dp_rank": dp[0],
                    "dp_size": dp[1],
                    "pp_rank": 0,
                    "pp_size": 1,
                    "rank": tp_rank,
                    "size": 2,
                }
            ],
        }

    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    before = se.rank_checksums([info(0, {qkv: "a", "n": "b"}), info(1, {qkv: "c", "n": "b"})])
    assert se.diff_rank_checksums(before, before) == []
    after = se.rank_checksums([info(0, {qkv: "a", "n": "b"}), info(1, {qkv: "z"})])
    assert se.diff_rank_checksums(before, after) == [
        f"{qkv}: hash differs on tp rank 1; written from HF model.layers.0.self_attn.q_proj.weight, "
        "model.layers.0.self_attn.k_proj.weight, model.layers.0.self_attn.v_proj.weight",
        "n (tp rank 1): reported only before the sync",
    ]
    assert list(se.rank_checksums([info(0, {}, dp=(1, 2))])) == ["tp rank 0 dp rank 1"]
    with pytest.raises(se.WeightUpdateError, match="two answers for tp rank 0"):
        se.rank_checksums([info(0, {}), info(0, {})])
    with pytest.raises(se.WeightUpdateError, match="no per-rank checksums"):
        se.rank_checksums(None)


def _sha(t):
    return hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()[:16]


def test_sglang_probe_checksums_vouch_for_a_tensor_only_when_its_parameter_holds_it():
    """ProbeHashes (the per-probe checksum half for SGLang): the engine's parameters are built
    here by hand the way SGLang's loaders lay them out at TP 1 (fused q/k/v, a vocabulary padded
    with zero rows to 64), in bf16 while the trainer sends fp32."""
    g = torch.Generator().manual_seed(0)
    a = "model.layers.0.self_attn."
    sent = {
        "model.embed_tokens.weight": torch.randn(100, 8, generator=g),
        a + "q_proj.weight": torch.randn(8, 8, generator=g),
        a + "k_proj.weight": torch.randn(4, 8, generator=g),
        a + "v_proj.weight": torch.randn(4, 8, generator=g),
        "model.norm.weight": torch.randn(8, generator=g),
        "model.layers.0.mlp.experts.0.gate_proj.weight": torch.randn(8, 8, generator=g),
        "lm_head.weight": None,
    }
    sent["lm_head.weight"] = sent["model.embed_tokens.weight"].clone()
    bf = torch.bfloat16
    q, k, v = (sent[a + f"{p}_proj.weight"] for p in "qkv")
    engine = {  # SGLang's names; the experts are stacked under another name (not comparable)
        "model.embed_tokens.weight": _sha(torch.cat([sent["model.embed_tokens.weight"], torch.zeros(28, 8)]).to(bf)),
        a + "qkv_proj.weight": _sha(torch.cat([q, k, v]).to(bf)),
        "model.norm.weight": _sha(sent["model.norm.weight"].to(bf)),
    }
    reference = {n: tensor_checksum(t) for n, t in sent.items()}

    def probe(names=sent, tied=True):
        p = se.ProbeHashes(_sha, bf, tied=tied)
        items = [(n, sent[n]) for n in names]
        p.observe(items[:3])  # q_proj alone in the first bucket: its part waits for k and v
        p.observe(items[3:])
        return p

    got = probe().verdicts(engine)
    assert got["model.layers.0.mlp.experts.0.gate_proj.weight"] is None
    assert compare_checksums(reference, [got]) == {"compared": 6, "skipped": 1}

    wrong_order = dict(engine, **{a + "qkv_proj.weight": _sha(torch.cat([k, q, v]).to(bf))})
    with pytest.raises(WeightSyncError, match="3 different from what the trainer sent") as e:
        compare_checksums(reference, [probe().verdicts(wrong_order)])
    assert "holds other bytes than the HF tensors received give" in str(e.value)
    assert "model.layers.0.self_attn.q_proj.weight" in str(e.value)

    no_v = [n for n in sent if n != a + "v_proj.weight"]
    with pytest.raises(WeightSyncError, match=r"1 missing in the engine: model.layers.0.self_attn.v_proj.weight") as e:
        compare_checksums(reference, [probe(no_v).verdicts(engine)])
    assert "fused from model.layers.0.self_attn.v_proj.weight too, which never arrived" in str(e.value)

    changed = dict(sent, **{"lm_head.weight": sent["lm_head.weight"] + 1})
    p = se.ProbeHashes(_sha, bf, tied=True)
    p.observe(list(changed.items()))
    with pytest.raises(WeightSyncError, match="ties lm_head.weight to model.embed_tokens.weight"):
        compare_checksums({n: tensor_checksum(t) for n, t in changed.items()}, [p.verdicts(engine)])
    # a received tensor that differs from what the trainer recorded (a feeder's buffer overwritten)
    with pytest.raises(WeightSyncError, match="1 different from what the trainer sent: lm_head.weight"):
        compare_checksums(reference, [p.verdicts(dict(engine))])


# --------------------------------------------------------------------------- HFEngine ----
def test_hf_engine_check_weights(ckpt):
    model_dir, sd = ckpt
    eng = HFEngine(model_dir)
    assert _first_sync_diffs(eng, sd) == []
    diffs = _first_sync_diffs(eng, _swapped(sd))
    assert [d.split(":")[0] for d in diffs] == [Q0, Q1] and "max_abs_err=" in diffs[0]
    eng.check_weights("snapshot")
    eng.check_weights("reset_tensors")
    assert len(eng.check_weights("compare")) == len(eng.expected_weight_names())  # every tensor was reset
    with pytest.raises(EngineReleasedError, match="check_weights"):
        eng.release_memory([WEIGHTS]) or eng.check_weights("snapshot")


def test_hf_engine_can_start_from_the_checkpoint(ckpt):
    model_dir, sd = ckpt
    eng = HFEngine(random_model(qwen2_config()).config, load_weights_from=model_dir)
    for n, t in sd:
        assert torch.equal(eng.get_weight(n), t), n


# ------------------------------------------------- the protocol under HybridStep ----
class CheckpointTrainer:
    """The trainer protocol of a trainer at step 0: its weights are the checkpoint's."""

    def __init__(self, sd):
        self.sd = sd

    def onload(self):
        pass

    def offload(self):
        pass

    def sync(self, engines):
        for e in engines.members:
            e.update_weights(self.sd)
            e.finish_weight_update()
        return {"bytes": 0}


class SkippingHF(HFEngine):
    """Counts SKIPPED as received but never writes it (a copy that did not happen)."""

    def _load_bucket(self, bucket):
        names = super()._load_bucket([(n, t) for n, t in bucket if n != SKIPPED])
        return names + [SKIPPED] * any(n == SKIPPED for n, _ in bucket)


def _first_sync(engine, sd):
    hybrid = HybridStep(CheckpointTrainer(sd), offload=False, check_weight_sync_every=0, check_init_sync=True)
    engines = LocalEngines([engine])
    hybrid.launch(engines, lambda: None)
    hybrid.to_rollout(engines)
    return hybrid.events


def _engines(kind, model_dir):
    if kind == "hf":
        return lambda cls=HFEngine: cls(model_dir)
    return lambda cls=None: _sglang(model_dir, 2)[0]


@pytest.mark.parametrize("kind", ["hf", "sglang"])
def test_hybrid_first_sync_restores_the_checkpoint(wheel_sglang, ckpt, kind):
    model_dir, sd = ckpt
    events = _first_sync(_engines(kind, model_dir)(), sd)
    assert events == [
        "init_check_snapshot",
        "engine_launch_release",
        "trainer_build",
        "engine_resume_weights",
        "init_check_reset_tensors",
        "sync_weights",
        "init_check_compare",
        "engine_resume_kv_cache",
    ]


@pytest.mark.parametrize("kind", ["hf", "sglang"])
def test_hybrid_first_sync_names_a_tensor_not_written(wheel_sglang, ckpt, kind, monkeypatch):
    model_dir, sd = ckpt
    if kind == "hf":
        engine = SkippingHF(model_dir)
    else:
        engine = _sglang(model_dir, 2)[0]
        fake = WheelEngine.instances[-1]
        load = fake.model.load_weights
        monkeypatch.setattr(fake.model, "load_weights", lambda named: load([(n, t) for n, t in named if n != SKIPPED]))
    with pytest.raises(
        WeightSyncError,
        match=r"--check-weight-sync-init.*engine 0: " + SKIPPED.replace(".", r"\.") + r".*not written by the sync",
    ) as e:
        _first_sync(engine, sd)
    assert Q0 not in str(e.value)


@pytest.mark.parametrize("kind", ["hf", "sglang"])
def test_hybrid_first_sync_names_two_exchanged_tensors(wheel_sglang, ckpt, kind):
    model_dir, sd = ckpt
    with pytest.raises(WeightSyncError, match="--check-weight-sync-init") as e:
        _first_sync(_engines(kind, model_dir)(), _swapped(sd))
    msg = str(e.value)
    assert Q0 in msg and Q1 in msg and SKIPPED not in msg and "two tensors exchanged" in msg


def test_engine_options_start_engines_from_the_checkpoint(ckpt):
    from megatron_dapo.config import parse_args
    from megatron_dapo.driver.cluster import engine_options

    model_dir = str(ckpt[0])
    off = parse_args(["--hf-checkpoint", model_dir])
    on = parse_args(["--hf-checkpoint", model_dir, "--check-weight-sync-init"])
    assert engine_options(off, "sglang", 0, 0, model_dir)[0]["load_format"] == "dummy"
    assert engine_options(on, "sglang", 0, 0, model_dir)[0]["load_format"] == "auto"
    assert "load_weights_from" not in engine_options(off, "hf", 0, 0, model_dir)[0]
    assert engine_options(on, "hf", 0, 0, model_dir)[0]["load_weights_from"] == model_dir


def test_check_refused_when_the_trainer_does_not_start_from_the_checkpoint(ckpt, tmp_path):
    from megatron_dapo.config import ConfigError, parse_args, validate

    model_dir = str(ckpt[0])
    cfg = parse_args(["--hf-checkpoint", model_dir, "--check-weight-sync-init", "--load", str(tmp_path)])
    with pytest.raises(ConfigError, match="--check-weight-sync-init needs the trainer to start from --hf-checkpoint"):
        validate(cfg, on_gpu=False)


@pytest.mark.parametrize("kind", ["hf", "sglang"])
def test_without_launch_the_reset_exposes_a_tensor_not_written(wheel_sglang, ckpt, kind, monkeypatch):
    # No launch(): the engines were never released and still hold the checkpoint when the first
    # sync comes, so a tensor the sync skips would still equal its snapshot without the reset.
    model_dir, sd = ckpt
    if kind == "hf":
        engine = SkippingHF(model_dir)
    else:
        engine = _sglang(model_dir, 1)[0]
        fake = WheelEngine.instances[-1]
        load = fake.model.load_weights
        monkeypatch.setattr(fake.model, "load_weights", lambda named: load([(n, t) for n, t in named if n != SKIPPED]))
    hybrid = HybridStep(CheckpointTrainer(sd), offload=False, check_weight_sync_every=0, check_init_sync=True)
    with pytest.raises(WeightSyncError, match=SKIPPED.replace(".", r"\.")):
        hybrid.to_rollout(LocalEngines([engine]))
    assert hybrid.events == [
        "init_check_snapshot",
        "engine_resume_weights",
        "init_check_reset_tensors",
        "sync_weights",
        "init_check_compare",
    ]
