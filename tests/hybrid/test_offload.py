"""Offload releases every param/grad/optimizer storage; onload restores them bitwise."""

import pytest

from tests.hybrid import bodies
from tests.tiny import tiny_qwen2_config

pytestmark = [pytest.mark.gloo]


@pytest.mark.parametrize(
    "tp,pp,distributed_optimizer",
    [(2, 1, False), (1, 1, True)],  # world 2: TP2 / DP2 with the distributed optimizer
)
def test_offload_onload_bitwise(gloo, tp, pp, distributed_optimizer):
    outs = gloo(2).run(bodies.offload_roundtrip, tiny_qwen2_config(), tp, pp, distributed_optimizer)
    for o in outs:
        assert o["resident"] > 0 and o["freed"] > 0
        assert o["released"], "a storage kept its memory while offloaded"
        assert o["resident_off"] == 0
        assert o["equal"], "offload -> onload changed a parameter, gradient or optimizer state"
        assert o["same_training"], "training after offload/onload differs from training without"


def test_offload_plain_module_chunked_host_buffers(monkeypatch):
    import torch

    from megatron_dapo.hybrid import offload

    monkeypatch.setattr(offload, "HOST_CHUNK_BYTES", 1000)  # 4936-byte weight -> 5 host chunks

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(1234))
            self.b = torch.nn.Parameter(torch.randn(3))

    m = M()
    m.w.grad = torch.randn(1234)
    ref = [t.detach().clone() for t in (m.w, m.b, m.w.grad)]
    off = offload.TrainerOffloader(m, None)
    assert off.offload() == 3 * 4 + 2 * 1234 * 4
    assert all(t.untyped_storage().nbytes() == 0 for t in (m.w, m.b, m.w.grad))
    assert sorted(len(v) for v in off._host.values()) == [1, 5, 5]
    off.onload()
    for _ in range(2):  # host buffers are reused
        off.offload()
        off.onload()
    assert all(torch.equal(a, b) for a, b in zip(ref, (m.w, m.b, m.w.grad)))
    with pytest.raises(RuntimeError):
        off.onload()
