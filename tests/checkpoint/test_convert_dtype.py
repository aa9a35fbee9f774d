"""tools/convert_hf_to_megatron.py keeps the source checkpoint's dtype unless --dtype says otherwise."""

import json

import pytest
import torch
from safetensors.torch import save_file

from tests.checkpoint.bodies import tool

conv = tool("convert_hf_to_megatron")


def _hf_dir(path, shards):
    """An HF-style directory of safetensors shards ({file: {name: tensor}}) with an index."""
    path.mkdir()
    weight_map = {}
    for fname, tensors in shards.items():
        save_file(tensors, str(path / fname))
        weight_map.update({name: fname for name in tensors})
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return str(path)


@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_single_dtype_is_kept(tmp_path, dtype, name):
    d = _hf_dir(
        tmp_path / "m",
        {
            "a.safetensors": {"w": torch.zeros(2, 2, dtype=dtype)},
            "b.safetensors": {"v": torch.zeros(3, dtype=dtype), "ids": torch.zeros(2, dtype=torch.int64)},
        },
    )
    assert conv.source_dtype(d) == name


def test_mixed_dtypes_take_the_widest(tmp_path):
    # e.g. bf16 weights with fp32 norms: fp32 keeps every tensor exactly
    d = _hf_dir(
        tmp_path / "m",
        {
            "a.safetensors": {"w": torch.zeros(2, dtype=torch.bfloat16)},
            "b.safetensors": {"norm": torch.zeros(2, dtype=torch.float32)},
        },
    )
    assert conv.source_dtype(d) == "fp32"
    d2 = _hf_dir(
        tmp_path / "m2",
        {"a.safetensors": {"w": torch.zeros(2, dtype=torch.bfloat16), "u": torch.zeros(2, dtype=torch.float16)}},
    )
    assert conv.source_dtype(d2) == "fp32"


def test_unmappable_dtype_names_the_tensor_and_the_flag(tmp_path):
    d = _hf_dir(tmp_path / "m", {"a.safetensors": {"w": torch.zeros(2, dtype=torch.float64)}})
    with pytest.raises(SystemExit, match=r"F64 \(e.g. 'w'\).*--dtype bf16\|fp16\|fp32"):
        conv.source_dtype(d)


def test_dtype_flag_defaults_to_the_source_and_accepts_overrides():
    assert conv.parse_args(["--hf-checkpoint", "x", "--save", "y"]).dtype is None
    assert conv.parse_args(["--hf-checkpoint", "x", "--save", "y", "--dtype", "bf16"]).dtype == "bf16"
