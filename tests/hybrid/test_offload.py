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
        assert o["host_copy_bytes"] == o["freed"]  # preserve_grads=True: everything copied


@pytest.mark.parametrize("tp,distributed_optimizer", [(2, False), (1, True)])
def test_default_offload_does_not_copy_grads_and_training_is_unchanged(gloo, tp, distributed_optimizer):
    # The trainer's offload (TrainerOffloader's default): gradients are released without a host
    # copy and come back zeroed; the next step zeroes them anyway, so training is bitwise the same.
    outs = gloo(2).run(bodies.offload_roundtrip, tiny_qwen2_config(), tp, 1, distributed_optimizer, False)
    for o in outs:
        assert o["grad_bytes"] > 0 and o["released"] and o["resident_off"] == 0
        assert o["host_copy_bytes"] == o["freed"] - o["grad_bytes"], "the gradients were copied to host"
        assert o["grads_zero"], "gradients came back with old contents"
        assert o["equal"], "offload -> onload changed a parameter or optimizer state"
        assert o["same_training"], "training after offload/onload without gradients differs from training without"


def test_trainer_offloader_default_skips_grads():
    import torch

    from megatron_dapo.hybrid import offload

    m = torch.nn.Linear(5, 3)
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    off = offload.TrainerOffloader(m, None)
    assert off.offload() == 2 * (15 + 3) * 4  # params and grads released
    assert off.last["host_copy_bytes"] == (15 + 3) * 4  # only the params copied
    off.onload()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in m.parameters())


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
    off = offload.TrainerOffloader(m, None, preserve_grads=True)
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


def test_state_on_another_device_is_neither_moved_nor_counted_resident():
    """On a GPU, torch's Adam keeps its ``step`` counters on the host beside CUDA parameters:
    the offload leaves them and resident_bytes() must not count them (the H200 check reported
    96 resident bytes, its 24 step counters, and failed). Here the parameters are on the CPU and
    the off-device state sits on ``meta``."""
    import torch

    from megatron_dapo.hybrid import offload

    m = torch.nn.Linear(4, 2)

    class Opt:  # the shape trainer_tensors reads: param_groups + state
        def __init__(self):
            self.param_groups = [{"params": list(m.parameters())}]
            self.state = {
                p: {"exp_avg": torch.zeros_like(p), "step": torch.zeros((), device="meta")} for p in m.parameters()
            }

    off = offload.TrainerOffloader(m, Opt())
    assert all(s.device.type == "cpu" for _, s in off.storages())
    off.offload()
    assert off.resident_bytes() == 0
    off.onload()
    assert off.resident_bytes() > 0
