"""Bodies of tests/hybrid/test_probe_check.py: the weight-sync check through the real path
(PolicyWorker -> WeightSync -> HFEngine, HybridStep with InProcessTrainer), one gloo rank."""

from __future__ import annotations

import torch

Q0 = "model.layers.0.self_attn.q_proj.weight"
Q1 = "model.layers.1.self_attn.q_proj.weight"
STALE = "model.layers.1.mlp.down_proj.weight"
MISSING = "model.layers.0.mlp.up_proj.weight"


def _engine_classes():
    from megatron_dapo.rollout.hf_engine import HFEngine

    class Swapped(HFEngine):
        """Loads layer 0's q_proj under layer 1's name and the other way round."""

        def _load_bucket(self, bucket):
            names = [n for n, _ in bucket]
            if Q0 in names and Q1 in names:
                d = dict(bucket)
                bucket = [(n, d[Q1] if n == Q0 else d[Q0] if n == Q1 else t) for n, t in bucket]
            return super()._load_bucket(bucket)

    class Stale(HFEngine):
        """Counts STALE as received but keeps its old value (a copy that never happened)."""

        def _load_bucket(self, bucket):
            names = super()._load_bucket([(n, t) for n, t in bucket if n != STALE])
            return names + [STALE] * any(n == STALE for n, _ in bucket)

    class Missing(HFEngine):
        """Has no MISSING tensor and ignores it when sent (SGLang's load_weights skips names
        it does not know the same way)."""

        def expected_weight_names(self):
            return [n for n in super().expected_weight_names() if n != MISSING]

        def _load_bucket(self, bucket):
            return super()._load_bucket([(n, t) for n, t in bucket if n != MISSING])

        def weight_checksums(self, dtypes=None):
            return {n: c for n, c in super().weight_checksums(dtypes).items() if n != MISSING}

    class Noisy(HFEngine):
        """Correct weights; its logprobs get bf16-scale noise: gaussian (sigma 0.02) on every
        token and three outliers of 0.5 .. 1.0 (what two correct bf16 implementations show)."""

        def score(self, sequences, prompt_lens):
            out = super().score(sequences, prompt_lens)
            g = torch.Generator().manual_seed(7)
            noisy = []
            for row in out:
                r = torch.tensor(row, dtype=torch.float64)
                r = r + 0.02 * torch.randn(len(row), generator=g, dtype=torch.float64)
                for k, v in zip((3, len(row) // 2, len(row) - 2), (0.5, -0.8, 1.0)):
                    r[k] += v
                noisy.append(r.tolist())
            return noisy

    return {"correct": HFEngine, "swapped": Swapped, "stale": Stale, "missing": Missing, "noisy": Noisy}


def weight_sync_checks(hf_dir: str, param_dtype_name: str = "float32"):
    """Each engine kind through HybridStep.to_rollout (sync 0, checked): the outcome per kind."""
    from transformers import AutoConfig

    from megatron_dapo.config import parse_args
    from megatron_dapo.hybrid.phases import HybridStep, InProcessTrainer, LocalEngines
    from megatron_dapo.hybrid.weight_sync import WeightSyncError
    from megatron_dapo.training.worker import PolicyWorker

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
            "--lr",
            "1e-3",
        ]
    )
    worker = PolicyWorker(0, 1, "127.0.0.1", 0, cfg, hf_dir)
    worker.load_initial_weights()
    conf = AutoConfig.from_pretrained(hf_dir)
    g = torch.Generator().manual_seed(3)
    probe = [torch.randint(3, conf.vocab_size, (64,), generator=g).tolist()]
    out = {}
    for kind, cls in _engine_classes().items():
        torch.manual_seed(99)  # the engine's own (old) weights differ from the trainer's
        engine = cls(conf)
        hybrid = HybridStep(
            InProcessTrainer(worker, offload=False),
            offload=False,
            check_weight_sync_every=1,
            param_dtype=getattr(torch, param_dtype_name) if kind == "noisy" else torch.float32,
        )
        try:
            info = hybrid.to_rollout(LocalEngines([engine]), probe=probe)
            out[kind] = {
                "raised": False,
                "max": info["probe_max_abs"],
                "check": dict(getattr(hybrid, "last_check", {})),
            }
        except WeightSyncError as e:
            out[kind] = {"raised": True, "msg": str(e)}
        engine.shutdown()
    return out


def probe_with_host_reference():
    """compare_with_engine over the default group (NCCL on a GPU) with megatron's logprobs
    handed over on the host: the all-reduced statistics must live on the group's device."""
    import torch

    from tests.hybrid.probe_helpers import compare_with_engine

    class Echo:
        def score(self, seqs, prompt_lens):
            return [[-1.0] * (len(s) - 1) for s in seqs]

    import torch.distributed as dist

    seen, real = [], dist.all_reduce

    from megatron_dapo.platform import tensor_side

    def recording(t, *a, **k):  # the side each all-reduce is handed, as strict mode tracks it (its
        seen.append(str(tensor_side(t)[0]))  # check lets through a tensor made with device=<a host
        return real(t, *a, **k)  # tensor's device>, whose production side it cannot tell)

    toks = torch.arange(8).view(1, 8)
    ref = torch.full((1, 7), -1.0).cpu()  # a caller's host copy
    dist.all_reduce = recording
    try:
        got = compare_with_engine(ref, Echo(), toks, 1e-4)
    finally:
        dist.all_reduce = real
    from megatron_dapo.platform import ACCELERATOR

    return got, seen, str(ACCELERATOR)
