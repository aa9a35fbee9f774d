"""Weight sync of Qwen3-MoE into the CPU engine (HFEngine), bit for bit: the experts are
all-gathered over EP (and ETP) into the engine's naming (transformers' fused
``gate_up_proj`` / ``down_proj``), bucketed like dense weights (a bucket of 1 KiB: every
tensor alone; 1 GiB: one bucket per stage). Layouts: EP2 fed by rank 0 (the other replica
joins only its expert group's all-gathers; the EP all-gather lands in the slot), TP2 with
ETP2 (each expert's shards joined from the scratch) fed by both ranks by memory handles into
one engine process (the trainer's payload path)."""

import pytest
import torch

from tests.moe import bodies
from tests.tiny import checkpoint_state_dict, random_hf_model, tiny_qwen3_moe_config

pytestmark = [pytest.mark.gloo]

BUCKETS = [1024, 2**30]


@pytest.fixture(scope="module")
def moe_hf():
    cfg = tiny_qwen3_moe_config()
    model = random_hf_model(cfg, seed=4)
    return cfg, {n: p.detach().clone() for n, p in model.named_parameters()}, checkpoint_state_dict(model)


# (tp, pp, ep, etp, world, mode)
LAYOUTS = [(1, 1, 2, None, 2, "rank0"), (2, 1, 1, None, 2, "payloads")]


@pytest.mark.parametrize("tp,pp,ep,etp,world,mode", LAYOUTS, ids=[f"tp{t}ep{e}-{m}" for t, p, e, _, _, m in LAYOUTS])
def test_moe_sync_into_hf_engine_bit_exact(gloo, moe_hf, tp, pp, ep, etp, world, mode):
    cfg, params, sd = moe_hf
    outs = gloo(world).run(bodies.sync_into_hf_engine, cfg, sd, tp, pp, ep, etp, mode, BUCKETS, timeout=600)
    holders = [o for o in outs if o["weights"]]
    assert len(holders) == 1 and holders[0]["rank"] == 0
    if mode == "rank0":
        assert sorted(holders[0]["names"]) == sorted(params)  # the plan's names are the engine's
    for weights in holders[0]["weights"]:
        assert sorted(weights) == sorted(params)
        for n, t in params.items():
            assert weights[n].dtype == t.dtype and torch.equal(weights[n], t), n
    stats = holders[0]["stats"]
    assert stats[0][0] > stats[1][0]  # more buckets when they are small
    assert stats[0][1] == stats[1][1] == sum(t.numel() * t.element_size() for t in params.values())
