"""``resume_note``: whether a checkpoint saved at one layout resumes at another, and the note
the driver logs (pure; the resumes themselves: tests/training/test_reshard_resume.py)."""

from megatron_dapo.checkpoint.dist_ckpt import checkpoint_layout, resume_note, same_ranks
from megatron_dapo.training.train_checkpoint import run_layout


def _lay(tp=1, pp=1, cp=1, world=2, nodes=1, dist_opt=False):
    return run_layout(tp, pp, cp, world, nodes, dist_opt)


def test_same_layout_is_exact():
    ok, note = resume_note(_lay(), _lay())
    assert ok and note.startswith("same layout as saved (TP 1 x PP 1 x CP 1 x DP 2, 2 rank(s) on 1 node(s)")
    assert "exact resume" in note


def test_tp_change_reshards_and_rederives_rng():
    ok, note = resume_note(_lay(), _lay(tp=2))
    assert ok
    assert note == (
        "TP 1 -> 2, DP 2 -> 1: model and optimizer resharded by dist_checkpointing; per-rank RNG "
        "states re-derived from (seed, rank, step): resume not bit-exact"
    )


def test_two_nodes_to_one():
    ok, note = resume_note(_lay(world=16, nodes=2, tp=4), _lay(world=8, nodes=1, tp=4))
    assert ok and note.startswith("DP 4 -> 2, ranks 16 -> 8, nodes 2 -> 1: model and optimizer resharded")


def test_only_the_node_count_changes_keeps_the_rng_states():
    ok, note = resume_note(_lay(world=8, nodes=2), _lay(world=8, nodes=1))
    assert ok and note == (
        "nodes 2 -> 1: the same shards, read by other ranks; per-rank RNG states restored (every rank keeps its place)"
    )
    assert same_ranks(_lay(world=8, nodes=2), _lay(world=8, nodes=1))


def test_distributed_optimizer_switch_is_refused():
    ok, note = resume_note(_lay(dist_opt=True), _lay(dist_opt=False))
    assert not ok and "distributed optimizer on" in note and "pass --use-distributed-optimizer" in note
    ok, note = resume_note(_lay(), _lay(dist_opt=True, tp=2))
    assert not ok and "drop --use-distributed-optimizer" in note


def test_a_format_that_does_not_reshard_is_refused_on_another_layout_only():
    saved = dict(_lay(dist_opt=True), optimizer_format="dp_zero_gather_scatter")
    assert resume_note(saved, _lay(dist_opt=True))[0]
    ok, note = resume_note(saved, _lay(dist_opt=True, pp=2))
    assert not ok and "'dp_zero_gather_scatter' does not reshard" in note


def test_older_checkpoints():
    """No layout record: supported (same layout); only ``saved_with``: compared on what it has."""
    ok, note = resume_note(None, _lay())
    assert ok and "layout not recorded" in note
    old = checkpoint_layout(
        {"saved_with": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "world_size": 2}}
    )
    assert old == {"tp": 1, "pp": 1, "world_size": 2}
    assert resume_note(old, _lay())[1].startswith("same layout")
    assert same_ranks(old, _lay()) and not same_ranks(old, _lay(tp=2))
    assert resume_note(old, _lay(world=1))[1].startswith("ranks 2 -> 1")
    assert checkpoint_layout({}) is None
