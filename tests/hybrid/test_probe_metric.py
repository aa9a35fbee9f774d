"""The probe schedule (--check-weight-sync-every)."""

from megatron_dapo.hybrid.probe import should_check


def test_schedule():
    assert [should_check(i, 2) for i in range(4)] == [True, False, True, False]
    assert not any(should_check(i, 0) for i in range(3))
