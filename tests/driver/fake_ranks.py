"""Stand-in trainer ranks for ``driver.trainer_group.TrainerGroup`` without Ray: each method of a
``FakeRank`` has a ``.remote`` that records the call and returns the result at once (the group
is built with ``get=list``)."""

from __future__ import annotations

from megatron_dapo.training.stats import LossStats, StepStats


class _Method:
    def __init__(self, rank, name, fn):
        self.rank, self.name, self.fn = rank, name, fn

    def remote(self, *args, **kwargs):
        self.rank.calls.append((self.name, args, kwargs))
        return self.fn(*args, **kwargs)


class FakeRank:
    """Trainer rank ``rank`` of a (TP, PP, DP) grid laid out as megatron does (TP fastest, then
    DP, then PP). ``train`` returns one output per shard; ``compute_logprobs`` returns, per item,
    ``[rank + 0.5] * response length`` (so a test sees which rank's answer was kept)."""

    def __init__(self, rank: int, tp: int = 1, pp: int = 1, dp: int = 1):
        self.calls = []
        self.info_dict = {
            "rank": rank,
            "dp_rank": (rank // tp) % dp,
            "dp_size": dp,
            "last_stage": rank // (tp * dp) == pp - 1,
            "pid": 1000 + rank,
            "node_ip": "10.0.0.1",
        }
        lp = lambda items: [[rank + 0.5] * x.response_len for x in items]  # noqa: E731
        out = lambda shards, inject_nan=False: [  # noqa: E731
            StepStats(
                loss=LossStats(pg_loss=(float(sum(x.n_tokens for x in sh)), float(len(sh))), ratio_max=1.0 + rank),
                grad_norm=0.5,
                update_successful=not inject_nan,
                lr=1e-6,
            )
            for sh in shards
        ]
        for name, fn in {
            "compute_logprobs": lp,
            "compute_ref_logprobs": lp,
            "train": out,
            "load": lambda d: None,
            "save": lambda d, m: None,
            "export_hf": lambda d: [],
            "load_initial_weights": lambda: "hf",
            "build_reference": lambda: "ref",
            "rng_state": lambda: {"rank": rank},
            "set_rng_state": lambda s: None,
            "derive_rng_state": lambda step: 100 * rank + step,
            "full_weights": lambda: {f"w{rank}": rank},
            "onload": lambda: 0,
            "offload": lambda: 0,
            "probe_logprobs": lambda seqs: [[rank + 0.5] * (len(s) - 1) for s in seqs],
        }.items():
            setattr(self, name, _Method(self, name, fn))

    def sent(self, name: str) -> list:
        """The arguments of every call of ``name``, in order."""
        return [args for n, args, _ in self.calls if n == name]


def fake_group(tp: int = 1, pp: int = 1, dp: int = 1):
    from megatron_dapo.driver.trainer_group import TrainerGroup

    ranks = [FakeRank(r, tp, pp, dp) for r in range(tp * pp * dp)]
    return TrainerGroup(ranks, [r.info_dict for r in ranks], get=list), ranks
