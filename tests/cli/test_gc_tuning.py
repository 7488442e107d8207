"""The collector settings of `pyengine serve` / `pyengine perf` apply while they run and are
undone after (both also run inside other programs, such as this test session)."""

import gc

from pyengine.cli.gc_tuning import GC_YOUNG_THRESHOLD, settled_garbage_collector


def test_the_collector_is_settled_while_running_and_restored_after():
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    with settled_garbage_collector():
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > frozen_before          # start-up objects out of sight
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_an_error_inside_still_restores_the_collector():
    before = gc.get_threshold()
    try:
        with settled_garbage_collector():
            raise KeyError("boom")
    except KeyError:
        pass
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
