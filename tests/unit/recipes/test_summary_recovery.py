"""The run summary's "proc failures" row: recovery is the fault to the replacement's first progress,
serving the fault to its actors re-created, and a replacement that never made progress is said so."""

from rlmesh.recipes.loop import proc_failures_line


def test_recovery_and_serving_are_both_shown():
    c = {"proc_deaths": 3, "restarts": 3, "recoveries": 3, "median_recovery_s": 1.62, "median_serving_s": 0.14}
    assert proc_failures_line(c) == "3 died, 3 restarted, median recovery 1.62 s (serving 0.14 s)"


def test_a_replacement_without_progress_is_not_counted_as_recovered():
    c = {"proc_deaths": 2, "restarts": 2, "recoveries": 1, "median_recovery_s": 2.5, "median_serving_s": 0.2}
    assert proc_failures_line(c) == ("2 died, 2 restarted, median recovery 2.50 s (serving 0.20 s); "
                                     "1 made no progress before the end")
    c = {"proc_deaths": 1, "restarts": 1, "recoveries": 0, "median_recovery_s": None, "median_serving_s": 0.3}
    assert proc_failures_line(c) == "1 died, 1 restarted, none made progress before the end (median serving 0.30 s)"


def test_no_failures():
    c = {"proc_deaths": 0, "restarts": 0, "recoveries": 0, "median_recovery_s": None, "median_serving_s": None}
    assert proc_failures_line(c) == "0 died, 0 restarted"
