"""Checkpoint directories never lose what the run did not write: rotation by step number over
this run's own checkpoints only, refusals before the first save, and moving aside."""

import os

import pytest

from megatron_dapo.outputs import checkpoint_dirs as cd


def _save(root, step, run_id, keep_last=2):
    os.makedirs(cd.tmp_dir(str(root), step))
    with open(os.path.join(cd.tmp_dir(str(root), step), cd.STATE_FILE), "w") as f:
        f.write(f"{run_id}:{step}")
    return cd.commit(str(root), step, keep_last, run_id)


def _names(root):
    return [n for _, n in cd.steps(str(root))]


def test_rotation_orders_by_step_number_not_by_name(tmp_path):
    for s in (999_998, 999_999, 1_000_000):  # by name "step_1000000" < "step_999998": it was deleted
        _save(tmp_path, s, "A", keep_last=2)
    assert _names(tmp_path) == ["step_999999", "step_1000000"]
    assert cd.resolve(str(tmp_path)).endswith("step_1000000") and os.path.isdir(cd.resolve(str(tmp_path)))


def test_rotation_never_touches_another_runs_checkpoints(tmp_path):
    _save(tmp_path, 3, "B")
    _save(tmp_path, 4, "B")
    for s in (5, 6, 7):
        _save(tmp_path, s, "A", keep_last=2)
    assert _names(tmp_path) == ["step_000003", "step_000004", "step_000006", "step_000007"]
    assert cd.run_id_of(str(tmp_path / "step_000003")) == "B"
    with pytest.raises(FileExistsError, match="not written by this run"):
        _save(tmp_path, 4, "A")  # never replaces another run's step


def test_fresh_run_refuses_a_save_dir_of_another_run(tmp_path):
    _save(tmp_path, 4, "B")
    _save(tmp_path, 6, "B")
    cd.check_save_dir(str(tmp_path / "new"), "A", None)  # absent or empty: fine
    with pytest.raises(
        cd.SaveDirConflict,
        match=r"another run \(2 checkpoints, step_000004 .. step_000006\).*"
        r"new --save.*--load .*--start-over",
    ) as e:
        cd.check_save_dir(str(tmp_path), "A", None)
    assert e.value.names == ["step_000004", "step_000006"]
    assert _names(tmp_path) == ["step_000004", "step_000006"]  # refused, nothing changed


def test_rollback_with_later_steps_is_refused_then_moved_aside(tmp_path):
    for s in (5, 8, 9, 10):
        _save(tmp_path, s, "A", keep_last=10)
    cd.check_save_dir(str(tmp_path), "A", 10)  # resuming the latest: fine
    with pytest.raises(cd.SaveDirConflict, match=r"after step 5 \(3 checkpoints, step_000008 .. step_000010\)") as e:
        cd.check_save_dir(str(tmp_path), "A", 5)
    dest = cd.move_aside(str(tmp_path), e.value.names)
    assert sorted(os.listdir(dest)) == ["latest", "step_000008", "step_000009", "step_000010"]
    assert _names(tmp_path) == ["step_000005"] and not os.path.exists(tmp_path / "latest")
    cd.check_save_dir(str(tmp_path), "A", 5)
    _save(tmp_path, 6, "A", keep_last=1)  # rotation after the rollback: the aside copies are untouched
    assert _names(tmp_path) == ["step_000006"] and len(os.listdir(dest)) == 4


def test_checkpoints_without_a_run_file_are_never_removed(tmp_path):
    legacy = tmp_path / "step_000002"
    legacy.mkdir()
    (legacy / cd.STATE_FILE).write_text("old")
    cd.check_save_dir(str(tmp_path), "A", 2)  # resuming it: accepted, left alone
    with pytest.raises(cd.SaveDirConflict):
        cd.check_save_dir(str(tmp_path), "A", None)  # a fresh run beside it: refused
    for s in (3, 4, 5):
        _save(tmp_path, s, "A", keep_last=1)
    assert _names(tmp_path) == ["step_000002", "step_000005"]
