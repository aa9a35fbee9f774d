"""The converters' mistakes (issue 38, item 6), through the tools' own ``main``: each is one line
naming the file and the fix, exit 2, nothing written at ``--save``; and the checksums a
conversion records (every rank hashes the shards it wrote) catch a damaged byte on the way back.

Every refusal here comes before torch.distributed is started, so the tools run in this process.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from megatron_dapo.checkpoint import manifest
from megatron_dapo.errors import DEBUG_ENV
from tests.checkpoint.bodies import tool
from tests.foundation.test_user_errors import one_line


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def _one_line(capfd, main, argv, *needles) -> str:
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2, e.value.code
    return one_line(capfd.readouterr().err, *needles)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _sharded(src, dst):
    """``src`` saved again in shards of at most 40 kB (model.safetensors.index.json + files)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True)
    model.save_pretrained(str(dst), max_shard_size="40KB")
    return dst


def test_hf_checkpoint_mistakes_are_one_line_before_anything_is_built(tiny_hf, tmp_path, capfd):
    from safetensors.torch import load_file, save_file

    to_mg = tool("convert_hf_to_megatron").main
    src = tiny_hf["qwen2"]
    out = tmp_path / "out"

    def refused(hf_dir, *needles, extra=()):
        line = _one_line(capfd, to_mg, ["--hf-checkpoint", str(hf_dir), "--save", str(out), *extra], *needles)
        assert not out.exists(), line
        return line

    # a shard the index names is missing
    d = _sharded(src, tmp_path / "sharded")
    shards = sorted(f for f in os.listdir(d) if f.startswith("model-"))
    assert len(shards) >= 3, shards
    gone = _copy(d, tmp_path / "missing-shard")
    os.remove(gone / shards[1])
    refused(gone, shards[1], "missing", "download or copy it again")
    # the index places a tensor in a shard that does not hold it (shards of another download)
    moved = _copy(d, tmp_path / "moved-tensor")
    index = json.loads((moved / "model.safetensors.index.json").read_text())
    name = next(n for n, f in sorted(index["weight_map"].items()) if f == shards[0])
    index["weight_map"][name] = shards[1]
    (moved / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(moved, shards[1], repr(name), "places there")
    # a truncated file (its header whole, its data cut), and one cut inside its header
    for cut, what in ((0.5, "incomplete metadata"), (None, "header")):
        t = _copy(src, tmp_path / f"truncated-{what.split()[0]}")
        size = os.path.getsize(t / "model.safetensors")
        os.truncate(t / "model.safetensors", int(size * cut) if cut else 40)
        refused(t, "model.safetensors", "not a whole safetensors file", "truncated or damaged")
    # a missing tensor; a config of another depth; a config of another width
    tensors = load_file(os.path.join(src, "model.safetensors"))
    drop = _copy(src, tmp_path / "missing-tensor")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(drop / "model.safetensors"), metadata={"format": "pt"})
    line = refused(drop, "--hf-checkpoint", "missing 'model.layers.1.mlp.down_proj.weight'", "config.json")
    assert "config.json says" not in line, line  # the same depth: no word on the layer count
    cfg = json.loads(open(os.path.join(src, "config.json")).read())
    layers = cfg["num_hidden_layers"]
    for key, value, needles in (
        ("num_hidden_layers", layers + 1, (f"config.json says {layers + 1} layers, the weights hold {layers}",)),
        ("num_hidden_layers", layers - 1, ("not in the config's model", f"model.layers.{layers - 1}.")),
        ("intermediate_size", cfg["intermediate_size"] * 2, ("has shape", "intermediate_size", "came with these")),
    ):
        bad = _copy(src, tmp_path / f"cfg-{key}-{value}")
        (bad / "config.json").write_text(json.dumps(dict(cfg, **{key: value})))
        refused(bad, *needles)
    # no weights at all; TP 2 in one process (no launcher)
    empty = tmp_path / "no-weights"
    empty.mkdir()
    shutil.copy(os.path.join(src, "config.json"), empty / "config.json")
    refused(empty, "no model.safetensors or model.safetensors.index.json")
    refused(
        src,
        "needs a multiple of 2 processes",
        "torchrun --nproc-per-node 2",
        extra=("--tensor-model-parallel-size", "2"),
    )


def test_torch_dist_mistakes_and_damaged_bytes_are_one_line_before_anything_is_loaded(
    tiny_ckpt, tiny_hf, tmp_path, capfd
):
    to_hf = tool("convert_megatron_to_hf").main
    ck = tiny_ckpt["qwen2"]
    out = tmp_path / "out"
    shards = sorted(f for f in os.listdir(ck) if f.endswith(".distcp"))

    def refused(load, *needles, extra=()):
        line = _one_line(capfd, to_hf, ["--load", str(load), "--save", str(out), *extra], *needles)
        assert not out.exists(), line
        return line

    flipped = _copy(ck, tmp_path / "flipped")  # the same size: only the recorded digest can tell
    data = bytearray((flipped / shards[-1]).read_bytes())
    data[len(data) // 2] ^= 0x01
    (flipped / shards[-1]).write_bytes(bytes(data))
    refused(flipped, shards[-1], "damaged", "differ from those recorded at save")
    gone = _copy(ck, tmp_path / "gone")
    os.remove(gone / shards[0])
    refused(gone, shards[0], "missing")
    meta = _copy(ck, tmp_path / "meta")
    (meta / "megatron_dapo_checkpoint.json").write_text('{"format": "megatron_dapo_torch')
    refused(meta, "megatron_dapo_checkpoint.json", "damaged")
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    cfg = json.loads(open(os.path.join(tiny_hf["qwen2"], "config.json")).read())
    (cfg_dir / "config.json").write_text(json.dumps(dict(cfg, hidden_size=cfg["hidden_size"] * 2)))
    refused(ck, "--hf-config", "does not describe the checkpoint", "hidden_size", extra=("--hf-config", str(cfg_dir)))
    refused(ck, "--tokenizer", "directory not found", extra=("--tokenizer", str(tmp_path / "typo")))


@pytest.mark.gloo
def test_every_rank_records_the_shards_it_wrote_and_the_export_is_verified_on_read(gloo, tiny_hf, tmp_path, capfd):
    """A conversion by two TP ranks: checksums.json holds both ranks' shards (each hashed by the
    rank that wrote it, merged once) and every other file, with the digests of the bytes on disk;
    no rank's record is left behind."""
    import subprocess
    import sys

    from tests.checkpoint import bodies

    ck = str(tmp_path / "tp2")
    gloo(2).run(bodies.convert_hf, tiny_hf["qwen2"], ck, "fp32", "--tensor-model-parallel-size", "2")
    files = manifest.recorded(ck)
    on_disk = sorted(f for f in os.listdir(ck) if f != manifest.MANIFEST)
    assert sorted(files) == on_disk, (sorted(files), on_disk)
    assert {f for f in on_disk if f.endswith(".distcp")} >= {"__0_0.distcp", "__1_0.distcp"}, on_disk
    assert not any(f.startswith(manifest.RANK_RECORD) for f in os.listdir(ck))
    for rel, entry in files.items():
        assert manifest._digest(os.path.join(ck, rel)) == (entry["bytes"], entry["digest"]), rel
    # the HF export records its checksums too; a damaged byte there is refused on the way back in
    hf = tmp_path / "hf"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", DEBUG_ENV)}
    p = subprocess.run(
        [sys.executable, "tools/convert_megatron_to_hf.py", "--load", ck, "--save", str(hf)],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        env=dict(env, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert manifest.verify(str(hf)) is None and "model.safetensors" in manifest.recorded(str(hf))
    data = bytearray((hf / "model.safetensors").read_bytes())
    data[-5] ^= 0x01  # inside the last tensor's data: safetensors itself cannot tell
    (hf / "model.safetensors").write_bytes(bytes(data))
    line = _one_line(
        capfd,
        tool("convert_hf_to_megatron").main,
        ["--hf-checkpoint", str(hf), "--save", str(tmp_path / "back")],
        "model.safetensors is damaged",
        "export or copy it again",
    )
    assert not (tmp_path / "back").exists(), line
