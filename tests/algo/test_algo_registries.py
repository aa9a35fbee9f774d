"""One registry per choice a flag makes: the flag's choices (and so --help and validation) are
the registry's names, and docs/algorithm.md names every registered implementation."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from megatron_dapo.algo import AlgorithmConfig
from megatron_dapo.algo.advantages import ADVANTAGE_ESTIMATORS
from megatron_dapo.algo.kl import KL_ESTIMATORS
from megatron_dapo.algo.policy_losses import POLICY_LOSSES
from megatron_dapo.algo.tis import TIS_MODES
from megatron_dapo.config import parse_args

DOC = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "algorithm.md").read_text()
FIELDS = {f.name: f for f in dataclasses.fields(AlgorithmConfig)}
REGISTRIES = {
    "advantage_estimator": ADVANTAGE_ESTIMATORS,
    "policy_loss": POLICY_LOSSES,
    "kl_estimator": KL_ESTIMATORS,
    "tis_mode": TIS_MODES,
}


@pytest.mark.parametrize("field", sorted(REGISTRIES))
def test_the_flags_choices_are_the_registrys_names_and_the_doc_names_each(field):
    reg = REGISTRIES[field]
    f = FIELDS[field]
    assert tuple(f.metadata["choices"]) == reg.names()
    assert reg.flag == f.metadata["flag"]
    for name in reg:
        assert f"`{name}`" in DOC or f",{name}" in DOC or f"{{{name}," in DOC, (field, name)
        # every registered name parses and validates
        cfg = parse_args([reg.flag, name, *_companions(field, name)]).algo
        assert getattr(cfg, field) == name
    with pytest.raises(SystemExit):
        parse_args([reg.flag, "no-such-" + field])


def _companions(field, name):
    """The flags a registered loss is defined with (its aggregation)."""
    if field == "policy_loss" and POLICY_LOSSES.get(name).aggregation:
        return ["--loss-agg-mode", POLICY_LOSSES.get(name).aggregation[0]]
    return []
