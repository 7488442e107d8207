"""Every Spark test runs in one xdist worker (one JVM, one workload for the run): the conftest
marks them, and the pinned pytest/pytest-xdist pair must carry the mark to the scheduler.
pytest 9.2 with pytest-xdist 3.8 silently does not (pytest-xdist #1386): the suite then starts a
JVM in every worker."""


def test_spark_tests_are_one_group_and_xdist_schedules_them_as_one(request):
    assert [m.args for m in request.node.iter_markers("xdist_group")] == [("spark",)]
    if getattr(request.config.option, "loadgroup", False):        # a worker of --dist loadgroup
        assert request.node.nodeid.endswith("@spark"), (
            f"{request.node.nodeid}: the group did not reach xdist's scheduler")
