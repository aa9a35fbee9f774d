"""``--check-weight-sync-init`` on the real path: a megatron trainer at step 0 (weights from
--hf-checkpoint) syncs into an HFEngine that loaded the same checkpoint, recorded it and was
overwritten with random values: every tensor comes back bitwise (the trainer's HF -> megatron ->
HF round trip is exact); an engine that exchanges two tensors or keeps one unwritten fails
naming them."""

from __future__ import annotations

import pytest

from tests.hybrid import check_bodies, init_check_bodies


@pytest.fixture(scope="module")
def outcomes(gloo, tmp_path_factory):
    from tests.e2e.fixtures import make_tiny_qwen2_dir

    hf = make_tiny_qwen2_dir(str(tmp_path_factory.mktemp("hf") / "hf"))
    (o,) = gloo(1).run(init_check_bodies.init_checks, hf, timeout=900)
    return o


@pytest.mark.gloo
def test_the_trainers_first_sync_restores_the_checkpoint_bitwise(outcomes):
    o = outcomes["correct"]
    assert not o["raised"], o
    assert o["events"][:2] == ["init_check_snapshot", "engine_launch_release"]
    assert "init_check_compare" in o["events"]


@pytest.mark.gloo
@pytest.mark.parametrize(
    "kind,names", [("swapped", [check_bodies.Q0, check_bodies.Q1]), ("stale", [check_bodies.STALE])]
)
def test_a_broken_first_sync_fails_naming_the_tensors(outcomes, kind, names):
    o = outcomes[kind]
    assert o["raised"], o
    assert "--check-weight-sync-init" in o["msg"]
    for n in names:
        assert n in o["msg"], o["msg"]
