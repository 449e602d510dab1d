"""benchmarks/suite_cpu.py: the parts and the rest part's test files are found in a run's output,
and the machine's CPU time is read from /proc/stat."""

from __future__ import annotations

from benchmarks.suite_cpu import busy_and_total_ticks, spans

OUTPUT = [
    (100.0, "python3.11 -m venv --clear .venv"),
    (160.0, ".venv/bin/python -m pytest --part check -n auto "),
    (170.0, "tests/pipeline/test_config.py ....  [ 50%]"),
    (300.0, ".venv/bin/python -m pytest --part rest "),
    (301.0, "============================= test session starts =============================="),
    (420.0, "tests/dags/test_dag_emr.py ........  [ 40%]"),
    (900.0, "tests/e2e/test_compose_stack.py .  [ 80%]"),
    (950.0, "============ 2 passed, 976 deselected in 650.00s ============"),
]


def test_a_run_is_cut_into_its_parts_and_the_rest_into_its_files():
    parts, files = spans(OUTPUT, 90.0, 960.0)
    assert parts == [("whole run", 90.0, 960.0), ("check", 160.0, 300.0), ("rest", 300.0, 960.0)]
    # A file's line comes once its tests are done: its time runs from the line before it.
    assert files == [
        ("tests/dags/test_dag_emr.py", 300.0, 420.0),
        ("tests/e2e/test_compose_stack.py", 420.0, 900.0),
    ]


def test_the_machines_cpu_time_only_grows_and_busy_is_part_of_it():
    busy, total = busy_and_total_ticks()
    sum(range(2_000_000))
    later_busy, later_total = busy_and_total_ticks()
    assert 0 < busy <= total and busy <= later_busy <= later_total and later_total > total
