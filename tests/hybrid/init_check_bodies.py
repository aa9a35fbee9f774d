"""Body of tests/hybrid/test_init_check.py: ``--check-weight-sync-init`` through the real path
(PolicyWorker loaded from the HF checkpoint -> WeightSync -> HFEngine started from the same
checkpoint, HybridStep with InProcessTrainer), one gloo rank."""

from __future__ import annotations


def init_checks(hf_dir: str):
    """The first sync of a trainer at step 0 into engines that loaded the checkpoint: the
    outcome per engine kind (correct, swapped, stale: tests/hybrid/check_bodies.py)."""
    from megatron_dapo.config import parse_args
    from megatron_dapo.hybrid.phases import HybridStep, InProcessTrainer, LocalEngines
    from megatron_dapo.hybrid.weight_sync import WeightSyncError
    from megatron_dapo.training.worker import PolicyWorker
    from tests.hybrid.check_bodies import _engine_classes

    cfg = parse_args(
        [
            "--hf-checkpoint",
            hf_dir,
            "--micro-batch-size",
            "2",
            "--global-batch-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--n-samples-per-prompt",
            "2",
            "--check-weight-sync-init",
        ]
    )
    worker = PolicyWorker(0, 1, "127.0.0.1", 0, cfg, hf_dir)
    worker.load_initial_weights()
    classes = _engine_classes()
    out = {}
    for kind in ("correct", "swapped", "stale"):
        engine = classes[kind](hf_dir)  # the checkpoint's weights, as --check-weight-sync-init launches it
        hybrid = HybridStep(
            InProcessTrainer(worker, offload=False),
            offload=False,
            check_weight_sync_every=0,
            check_init_sync=cfg.rollout.check_weight_sync_init,
        )
        engines = LocalEngines([engine])
        try:
            hybrid.launch(engines, lambda: None)
            hybrid.to_rollout(engines)
            out[kind] = {"raised": False, "events": list(hybrid.events)}
        except WeightSyncError as e:
            out[kind] = {"raised": True, "msg": str(e)}
        engine.shutdown()
    return out
