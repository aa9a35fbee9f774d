"""The training item (training/item.py): what Sample.to_item sends a trainer rank."""

import pickle

import pytest
import torch

from megatron_dapo.driver.batch import Sample
from megatron_dapo.training.item import TrainItem


def test_sample_to_item_carries_the_loss_fields_as_tensors():
    s = Sample(
        prompt_index=0,
        prompt_ids=[1, 2],
        response_ids=[5, 6, 7],
        engine_logprobs=[-0.5, -1.0, -1.5],
        finish_reason="stop",
        ground_truth="x",
        advantage=0.25,
        train=False,
        old_logprobs=[-0.4, -0.9, -1.4],
        stale_len=1,
        routed_experts=torch.zeros(4, 2, 2, dtype=torch.int16),
    )
    x = s.to_item()
    assert x.tokens.dtype == torch.long and x.tokens.tolist() == [1, 2, 5, 6, 7]
    assert (x.prompt_len, x.n_tokens, x.response_len) == (2, 5, 3)
    assert x.old_logprobs.dtype == torch.float32 and x.old_logprobs.tolist() == pytest.approx([-0.4, -0.9, -1.4])
    assert x.engine_logprobs.tolist() == pytest.approx([-0.5, -1.0, -1.5])
    assert x.ref_logprobs is None and x.weights is None
    assert (x.advantage, x.train, x.stale_len) == (0.25, False, 1)
    assert x.routed_experts.shape == (4, 2, 2)
    y = pickle.loads(pickle.dumps(x))  # what a Ray call does with it
    assert torch.equal(y.tokens, x.tokens) and torch.equal(y.old_logprobs, x.old_logprobs)


def test_engine_logprobs_of_another_length_are_dropped_and_prompt_len_is_checked():
    # the importance ratio is then 1 (the old logprobs stand in): token_weights.engine_logprobs_of
    assert TrainItem(tokens=[1, 2, 3], prompt_len=1, engine_logprobs=[-1.0]).engine_logprobs is None
    assert TrainItem(tokens=[1, 2, 3], prompt_len=1, engine_logprobs=[]).engine_logprobs is None
    assert TrainItem(tokens=[1, 2], prompt_len=2).response_len == 0
    with pytest.raises(ValueError, match="prompt_len 3 outside 1..2"):
        TrainItem(tokens=[1, 2], prompt_len=3)
    with pytest.raises(ValueError, match="prompt_len 0"):
        TrainItem(tokens=[1, 2], prompt_len=0)
