"""logprob_mismatch (pure) and the probe schedule."""

import argparse

import pytest
import torch

from megatron_dapo.hybrid.probe import add_weight_sync_args, logprob_mismatch, should_check


def test_logprob_mismatch():
    a = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    b = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -0.25, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 1, 0]])
    out = logprob_mismatch(a, b, m)
    assert out["max_abs"] == pytest.approx(0.5)
    assert out["mean_abs"] == pytest.approx((0.5 + 0 + 0 + 0.25) / 4)
    full = logprob_mismatch(a, b)
    assert full["max_abs"] == pytest.approx(9.0)
    assert logprob_mismatch(a, b, torch.zeros_like(m)) == {"mean_abs": 0.0, "max_abs": 0.0}
    with pytest.raises(ValueError):
        logprob_mismatch(a, b[:, :2])


def test_schedule_and_args():
    assert [should_check(i, 2) for i in range(4)] == [True, False, True, False]
    assert not any(should_check(i, 0) for i in range(3))
    p = argparse.ArgumentParser()
    add_weight_sync_args(p)
    ns = p.parse_args(["--check-weight-sync-every", "5"])
    assert ns.check_weight_sync_every == 5 and ns.weight_sync_bucket_mb == 512
