"""Bad input -> ValueError whose message names the argument."""

import pytest
import torch

from megatron_dapo.algo import (
    aggregate_loss,
    compute_group_advantages,
    dynamic_sampling_mask,
    entropy_from_logits,
    kl_k3,
    kl_penalty,
    overlong_filter_mask,
    overlong_penalty,
    policy_loss,
)

Z = torch.zeros(2, 3)
M = torch.ones(2, 3)
A = torch.zeros(2)

CASES = [
    # compute_group_advantages
    ("rewards", lambda: compute_group_advantages(torch.zeros(0), 2)),
    ("rewards", lambda: compute_group_advantages(torch.zeros(2, 2), 2)),
    ("group_size", lambda: compute_group_advantages(torch.zeros(6), 4)),
    ("group_size", lambda: compute_group_advantages(torch.zeros(6), 0)),
    ("group_size", lambda: compute_group_advantages(torch.zeros(6), 2.0)),
    ("group_size", lambda: compute_group_advantages(torch.zeros(6), True)),
    ("eps", lambda: compute_group_advantages(torch.zeros(6), 2, eps=-1.0)),
    # policy_loss
    ("logprobs", lambda: policy_loss(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0), torch.zeros(0, 3))),
    ("logprobs", lambda: policy_loss(torch.zeros(6), torch.zeros(6), A, torch.ones(6))),
    ("old_logprobs", lambda: policy_loss(Z, torch.zeros(2, 4), A, M)),
    ("loss_mask", lambda: policy_loss(Z, Z, A, torch.ones(3, 3))),
    ("advantages", lambda: policy_loss(Z, Z, torch.zeros(3), M)),
    ("advantages", lambda: policy_loss(Z, Z, torch.zeros(2, 4), M)),
    ("eps_low", lambda: policy_loss(Z, Z, A, M, eps_low=1.1)),
    ("eps_low", lambda: policy_loss(Z, Z, A, M, eps_low=1.5)),
    ("eps_low", lambda: policy_loss(Z, Z, A, M, eps_low=-0.1)),
    ("eps_high", lambda: policy_loss(Z, Z, A, M, eps_high=-0.1)),
    ("clip_ratio_c", lambda: policy_loss(Z, Z, A, M, clip_ratio_c=0.5)),
    # aggregate_loss
    ("mode", lambda: aggregate_loss(Z, M, "mean")),
    ("per_token_loss", lambda: aggregate_loss(torch.zeros(0, 3), torch.zeros(0, 3), "token-mean")),
    ("loss_mask", lambda: aggregate_loss(Z, torch.ones(2, 4), "token-mean")),
    ("global_token_count", lambda: aggregate_loss(Z, M, "token-mean", global_token_count=-1)),
    ("global_seq_count", lambda: aggregate_loss(Z, M, "seq-mean-token-mean", global_seq_count=torch.ones(2))),
    # overlong_penalty
    ("response_lengths", lambda: overlong_penalty(torch.tensor([10, -1]), 20, 5)),
    ("response_lengths", lambda: overlong_penalty(torch.tensor([], dtype=torch.long), 20, 5)),
    ("max_response_length", lambda: overlong_penalty([1], 0, 0)),
    ("overlong_buffer_length", lambda: overlong_penalty([1], 20, 21)),
    ("overlong_buffer_length", lambda: overlong_penalty([1], 20, -1)),
    ("penalty_factor", lambda: overlong_penalty([1], 20, 5, penalty_factor=-1.0)),
    # overlong_filter_mask
    ("truncated", lambda: overlong_filter_mask([])),
    ("truncated", lambda: overlong_filter_mask([{"length": 3}])),
    ("truncated", lambda: overlong_filter_mask([1.5j])),
    ("loss_mask", lambda: overlong_filter_mask([True, False], loss_mask=torch.ones(3, 2))),
    # dynamic_sampling_mask
    ("acc", lambda: dynamic_sampling_mask(torch.zeros(0), 2)),
    ("group_size", lambda: dynamic_sampling_mask(torch.zeros(5), 2)),
    ("metric", lambda: dynamic_sampling_mask(torch.zeros(4), 2, metric=torch.zeros(3))),
    # KL / entropy
    ("kind", lambda: kl_penalty(Z, Z, "k4")),
    ("ref_logprobs", lambda: kl_k3(Z, torch.zeros(3, 2))),
    ("logits", lambda: entropy_from_logits(torch.zeros(2, 3, dtype=torch.long))),
    ("logits", lambda: entropy_from_logits(torch.zeros(2, 0))),
    ("chunk_size", lambda: entropy_from_logits(torch.zeros(2, 3), chunk_size=0)),
]


@pytest.mark.parametrize("name, call", CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(CASES)])
def test_bad_input_raises_value_error_naming_the_argument(name, call):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(name), str(err.value)
