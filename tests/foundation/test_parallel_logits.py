"""A tiny Qwen2/Llama under TP1, TP2, PP2 and TP2xPP2 gives the HF model's logits."""

import pytest

from tests.foundation import bodies
from tests.tiny import tiny_llama_config, tiny_qwen2_config

pytestmark = [pytest.mark.gloo]


@pytest.mark.parametrize("tp,pp,world", [(1, 1, 2), (2, 1, 2), (1, 2, 2), (2, 2, 4)])
def test_qwen2_logits_equal_hf(gloo, tp, pp, world):
    diffs = gloo(world).run(bodies.logits_vs_hf, tiny_qwen2_config(), tp, pp)
    last = [d for d in diffs if d is not None]
    assert last, "no rank reported logits"
    assert max(last) < 1e-5, diffs


@pytest.mark.parametrize("tp,pp,world", [(2, 2, 4)])
def test_llama_tied_logits_equal_hf(gloo, tp, pp, world):
    diffs = gloo(world).run(bodies.logits_vs_hf, tiny_llama_config(), tp, pp)
    last = [d for d in diffs if d is not None]
    assert max(last) < 1e-5, diffs
