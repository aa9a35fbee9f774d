"""Issue 38, item 4: verified bytes. A checkpoint records every file's checksum when it is
committed; the dry run and a resume (the real entry point, before Ray) name the damaged file;
a damaged trainer state is one line (read with weights_only=True, never torch's advice); an HF
export carries the same record."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from megatron_dapo import train
from megatron_dapo.config import ConfigError, parse_args
from megatron_dapo.checkpoint import manifest
from megatron_dapo.outputs import checkpoint_dirs as cd
from megatron_dapo.outputs import run_lock
from megatron_dapo.outputs.run_dir import prepare_outputs
from tests.foundation.test_user_errors import _args, _no_debug, tiny  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def _release():
    yield
    run_lock.release_all()


def _save(save, step=2, run_id="r1"):
    """A committed checkpoint as the trainer writes one: shard files, the trainer state (with the
    RNG states the driver saves), run.json, then the checksums."""
    tmp = cd.tmp_dir(str(save), step)
    os.makedirs(os.path.join(tmp, "model"))
    with open(os.path.join(tmp, "__0_0.distcp"), "wb") as f:
        f.write(os.urandom(300_000))
    with open(os.path.join(tmp, "model", "common.pt"), "wb") as f:
        f.write(b"x" * 1000)
    state = {
        "step": step,
        "run_id": run_id,
        "driver_rng": random.Random(0).getstate(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
    }
    torch.save(state, os.path.join(tmp, cd.STATE_FILE))
    return cd.commit(str(save), step, 5, run_id)


def test_a_commit_records_every_file_and_verify_names_the_damaged_one(tmp_path):
    step = _save(tmp_path / "ckpt")
    files = manifest.recorded(step)
    assert set(files) == {"__0_0.distcp", "model/common.pt", cd.STATE_FILE, cd.RUN_FILE}
    assert manifest.verify(step) is None
    shard = os.path.join(step, "__0_0.distcp")
    with open(shard, "r+b") as f:  # one byte flipped, same size
        f.seek(150_000)
        b = f.read(1)
        f.seek(150_000)
        f.write(bytes([b[0] ^ 0xFF]))
    assert (
        manifest.verify(step) == "__0_0.distcp is damaged: its bytes differ from those recorded at save (blake2b-128)"
    )
    os.truncate(shard, 1000)
    assert (
        manifest.verify(step)
        == "__0_0.distcp is damaged: 1000 bytes, 300000 recorded at save (truncated or overwritten)"
    )
    os.unlink(shard)
    assert manifest.verify(step).startswith("__0_0.distcp is missing")
    # a checkpoint written before checksums existed is not refused
    os.unlink(os.path.join(step, manifest.MANIFEST))
    assert manifest.verify(step) is None and "no checksums recorded" in manifest.describe(step)


def test_each_rank_hashes_its_own_shards_and_the_commit_hashes_only_the_rest(tmp_path, monkeypatch):
    """Ranks 0 and 1 record the shards they wrote; the committer reads only the files no rank
    recorded (and a recorded file whose size changed since), then removes the ranks' records."""
    d = tmp_path / "ckpt"
    d.mkdir()
    for name, n in (("__0_0.distcp", 5000), ("__0_1.distcp", 700), ("__1_0.distcp", 3000), ("metadata.json", 40)):
        (d / name).write_bytes(os.urandom(n))
    assert os.path.basename(manifest.record_rank_files(str(d), 0)) == "checksums.rank0.json"
    manifest.record_rank_files(str(d), 1)
    assert sorted(manifest.recorded_by_rank(str(d))) == ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp"]
    (d / "__0_1.distcp").write_bytes(os.urandom(701))  # rewritten after its rank hashed it
    hashed = []
    real = manifest._digest
    monkeypatch.setattr(manifest, "_digest", lambda path: hashed.append(os.path.basename(path)) or real(path))
    manifest.write_manifest(str(d))
    assert sorted(hashed) == ["__0_1.distcp", "metadata.json"]
    assert sorted(os.listdir(d)) == ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "checksums.json", "metadata.json"]
    monkeypatch.setattr(manifest, "_digest", real)
    assert manifest.verify(str(d)) is None
    for name, entry in manifest.recorded(str(d)).items():
        assert real(str(d / name)) == (entry["bytes"], entry["digest"]), name


def test_the_entry_point_and_the_dry_run_name_a_damaged_shard_in_one_line(tiny, tmp_path, capfd):
    save = tmp_path / "ckpt"
    step = _save(save)
    with open(os.path.join(step, "__0_0.distcp"), "r+b") as f:
        f.write(b"\0" * 16)
    for extra in ((), ("--dry-run",)):
        capfd.readouterr()
        code = train.main(_args(tiny, tmp_path, "--load", str(save), *extra))
        err = capfd.readouterr()
        text = err.err + err.out
        assert code != 0 and "Traceback" not in text
        line = [x for x in text.splitlines() if "__0_0.distcp is damaged" in x]
        assert line and "step_000002" in line[0], text[-2000:]


def test_a_damaged_trainer_state_is_one_line_without_torchs_advice(tmp_path):
    save = tmp_path / "ckpt"
    step = _save(save)
    state = manifest.load_state(os.path.join(step, cd.STATE_FILE))  # weights_only=True reads the RNG states
    assert state["step"] == 2 and isinstance(state["numpy_rng"][1], np.ndarray)
    with open(os.path.join(step, cd.STATE_FILE), "wb") as f:
        f.write(os.urandom(2000))
    manifest.write_manifest(step)  # the bytes are "as recorded": the state itself is unreadable
    with pytest.raises(ConfigError) as e:
        prepare_outputs(parse_args(["--run-dir", str(tmp_path / "run"), "--load", str(save)]))
    msg = str(e.value)
    assert "\n" not in msg and "trainer_state.pt cannot be read" in msg and "give another checkpoint" in msg
    assert "weights_only" not in msg
    # a pickle that would run code is refused the same way, not executed
    with open(os.path.join(step, cd.STATE_FILE), "wb") as f:
        torch.save({"step": 2, "hook": os.system}, f)
    with pytest.raises(ValueError, match="cannot be read .*not a trainer state"):
        manifest.load_state(os.path.join(step, cd.STATE_FILE))


def test_an_hf_export_carries_its_checksums(tmp_path):
    def write(d):
        os.makedirs(d)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(os.urandom(4096))
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write("{}")

    out = cd.write_dir_atomically(str(tmp_path / "final_hf"), write)
    assert set(manifest.recorded(out)) == {"model.safetensors", "config.json"} and manifest.verify(out) is None
    os.truncate(os.path.join(out, "model.safetensors"), 10)
    assert manifest.verify(out).startswith("model.safetensors is damaged")
