"""Which layer spec a CUDA machine gets (models.provider): TE where it imports, and the trainer
never falls back to the local spec silently; scripts that pick by what the machine has use
te_importable(). The CUDA answers are simulated (torch.cuda.is_available patched): this
machine has no GPU."""

import pytest
import torch

from megatron_dapo.models import provider


def test_on_the_cpu_there_is_no_te_and_the_default_is_the_local_spec():
    assert not torch.cuda.is_available()
    assert provider.te_importable() is False
    assert provider.resolve_use_te(None) is False and provider.resolve_use_te(False) is False


def test_on_a_cuda_machine_without_te_scripts_get_local_and_the_trainer_refuses(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_te():
        raise ModuleNotFoundError("No module named 'transformer_engine'")

    monkeypatch.setattr(provider, "_import_te", no_te)
    assert provider.te_importable() is False  # gpu_dapo_step / gpu_feed_check then pass local
    with pytest.raises(RuntimeError, match="--transformer-impl local"):
        provider.resolve_use_te(None)  # the trainer: TE required on CUDA unless told otherwise
    assert provider.resolve_use_te(False) is False


def test_on_a_cuda_machine_with_te_both_choose_te(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(provider, "_import_te", lambda: None)
    assert provider.te_importable() is True
    assert provider.resolve_use_te(None) is True
