"""The trainer on a GPU, checked on the CPU (the GPU-first-contact table of docs/hybrid.md).

Each test fails on the code before the fix: batches left on the host, token counts reduced
from a host tensor over NCCL, sequence-parallel micro-batches of any length, logprobs of the
untempered distribution, context parallelism without its token budget and truncated sampling accepted
silently.
"""

from __future__ import annotations

import pytest
import torch

from megatron_dapo import distributed
from megatron_dapo.config import ConfigError, parse_args, validate
from megatron_dapo.training import dapo_step, forward
from tests.tiny import tiny_qwen2_config


class _DeviceCheckingChunk(torch.nn.Module):
    """A model chunk whose parameters live on ``meta``: every input must have been moved there
    (a host tensor meeting a meta weight is what a GPU run would meet as cpu-vs-cuda)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4, device="meta"))
        self.seen = []

    def forward(self, tokens, pos, mask):
        self.seen += [tokens.device, pos.device, mask.device]
        return tokens.float() * self.w.sum()


def test_forward_step_moves_batch_to_parameter_device():
    chunk = _DeviceCheckingChunk()
    batch = {
        "tokens": torch.ones(2, 5, dtype=torch.long),
        "loss_mask": torch.ones(2, 5),
        "advantages": torch.ones(2),
        "resp_start": 2,
    }
    seen_by_loss = {}

    def loss_fn(b, logits):
        seen_by_loss.update({k: v.device for k, v in b.items() if isinstance(v, torch.Tensor)})
        seen_by_loss["resp_start"] = b["resp_start"]
        return logits.sum(), {}

    out, loss_closure = forward.forward_step(iter([batch]), chunk, loss_fn)
    assert set(chunk.seen) == {torch.device("meta")}
    assert out.device.type == "meta"
    loss_closure(out)
    assert seen_by_loss == {
        "tokens": torch.device("meta"),
        "loss_mask": torch.device("meta"),
        "advantages": torch.device("meta"),
        "resp_start": 2,
    }
    assert batch["tokens"].device.type == "cpu"  # the caller's batch is not modified


def test_collective_device_follows_the_group_backend(monkeypatch):
    # the production branch (the strict test mode, once installed in this process, answers by group kind)
    monkeypatch.setattr(distributed.platform, "strict_installed", lambda: False)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(distributed.torch.cuda, "current_device", lambda: 3)
    assert distributed.collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda group=None: "gloo")
    assert distributed.collective_device() == torch.device("cpu")


def test_dp_token_counts_are_created_on_the_collective_device(monkeypatch):
    seen = {}
    monkeypatch.setattr(distributed, "collective_device", lambda group=None: torch.device("meta"))
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t, group=None: seen.update(device=t.device, group=group))
    out = distributed.dp_token_counts([3.0, 1.0], group="dp-group")
    assert dapo_step.dp_token_counts is distributed.dp_token_counts  # the trainer step's (and setup's) one helper
    assert seen == {"device": torch.device("meta"), "group": "dp-group"}
    assert out.device.type == "meta" and out.dtype == torch.float64


@pytest.mark.gloo
def test_sequence_parallel_micro_batches_are_padded_to_tp(gloo):
    outs = gloo(2).run(
        __import__("tests.training.bodies", fromlist=["x"]).sequence_parallel_padding, tiny_qwen2_config(), 2
    )
    for o in outs:
        assert o["plain"] == 1 and o["sp"] == 2
        assert o["lens"] == [[6, 8], [10]]  # 2 sequences per micro-batch, each padded to a multiple of TP


@pytest.mark.gloo
@pytest.mark.parametrize("tp", [1, 2])
def test_logprobs_and_entropy_use_the_rollout_temperature(gloo, tp):
    from tests.training import bodies

    for temperature in (0.6, 1.0):
        outs = [o for o in gloo(2).run(bodies.tempered_logprobs_vs_hf, tiny_qwen2_config(), tp, temperature) if o]
        assert outs
        for o in outs:
            assert o["n"] == [6, 3]
            assert o["logprob"] < 1e-5, (temperature, o)
            assert o["entropy"] < 1e-5, (temperature, o)


def _cfg(*extra):
    cfg = parse_args(
        [
            "--actor-num-gpus-per-node",
            "2",
            "--global-batch-size",
            "16",
            "--rollout-batch-size",
            "8",
            "--n-samples-per-prompt",
            "2",
            *extra,
        ]
    )
    return cfg


@pytest.mark.parametrize("on_gpu", [False, True])
def test_context_parallel_needs_packing_budget(on_gpu):
    # CP is implemented (packed sequences, tests/training/test_packing_parallel.py): it needs the token budget
    with pytest.raises(ConfigError, match="--context-parallel-size 2: packed micro-batches .*--max-tokens-per-gpu"):
        validate(_cfg("--context-parallel-size", "2"), on_gpu=on_gpu)
    validate(_cfg("--context-parallel-size", "2", "--max-tokens-per-gpu", "4096"), on_gpu=on_gpu)
    with pytest.raises(ConfigError, match="seq-mean-token-mean"):
        validate(
            _cfg(
                "--context-parallel-size", "2", "--max-tokens-per-gpu", "4096", "--loss-agg-mode", "seq-mean-token-mean"
            ),
            on_gpu=on_gpu,
        )


@pytest.mark.parametrize("flags", [("--rollout-top-p", "0.7"), ("--rollout-top-k", "20")])
def test_truncated_training_sampling_is_refused(flags):
    with pytest.raises(ConfigError, match="--rollout-top-p .* / --rollout-top-k .*full"):
        validate(_cfg(*flags), on_gpu=True)
    validate(_cfg("--rollout-top-p", "1.0", "--rollout-top-k", "-1"), on_gpu=True)


@pytest.mark.parametrize("deterministic", [False, True])
def test_sglang_engine_options(deterministic):
    """What each SGLang engine actor is launched with (GPU first contact: visible devices, seeds,
    tokenizer, deterministic inference, tempered logprobs); every kwarg is one the adapter takes."""
    import inspect

    from megatron_dapo.driver.cluster import engine_options
    from megatron_dapo.rollout.sglang_engine import USED_API, SGLangEngine

    cfg = _cfg("--rollout-num-gpus-per-engine", "2", "--seed", "7", *(["--deterministic"] if deterministic else []))
    kw, opts = engine_options(cfg, "sglang", 3, 2, "/tok")
    assert kw["tp_size"] == 2 and kw["base_gpu_id"] == 2 and kw["tokenizer_path"] == "/tok"
    assert kw["random_seed"] == 10 and kw["enable_deterministic_inference"] is deterministic
    assert kw["logprobs_mode"] == "processed"
    assert opts["runtime_env"]["env_vars"]["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    named = set(inspect.signature(SGLangEngine.__init__).parameters) | set(USED_API["server_args"])
    assert set(kw) <= named, set(kw) - named
    assert engine_options(cfg, "hf", 0, 0, "/tok") == ({"logprobs_mode": "processed"}, {})
