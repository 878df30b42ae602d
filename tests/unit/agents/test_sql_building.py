"""SQL built from tool arguments: literals are quoted, levels checked, results bounded."""

import duckdb
import pytest

from rlmesh.agents.mcp_server import _bounded
from rlmesh.telemetry.introspect import levels_at_least, lit, log_query, stack_query


def test_literals_cannot_break_out_of_the_string():
    con = duckdb.connect()
    evil = "x'; DROP TABLE logs; --"
    assert con.execute(f"SELECT {lit(evil)} AS v").fetchone()[0] == evil
    assert lit(None) == "NULL" and lit(3) == "3" and lit(True) == "true"


def test_log_query_is_one_select_with_every_filter():
    sql = log_query(mesh="m", rank=2, proc="m.2", level="warning", stream="stdout", contains="it's",
                    after="2026-01-01T00:00:00+00:00", limit=5)
    stmts = duckdb.extract_statements(sql)
    assert len(stmts) == 1 and str(stmts[0].type).endswith("SELECT")
    assert "level IN ('WARNING', 'ERROR', 'CRITICAL')" in sql and "'it''s'" in sql and "LIMIT 5" in sql


def test_log_query_filters_one_incarnation():
    """What a proc wrote before dying: its died incarnation's rows (a time window catches the replacement's)."""
    sql = log_query(proc="m.1", incarnation=1, stream="stdout", limit=1)
    assert "incarnation = 1" in sql and len(duckdb.extract_statements(sql)) == 1


def test_levels():
    assert levels_at_least("error") == ("ERROR", "CRITICAL")
    with pytest.raises(ValueError, match="DEBUG, INFO"):
        levels_at_least("LOUD")


def test_stack_query_parses():
    for sql in (stack_query(), stack_query(proc="p.1"), stack_query(dump_ids=["a", "b"]), stack_query(dump_ids=[])):
        assert len(duckdb.extract_statements(sql)) == 1


def test_bounded_wraps_selects_only_and_takes_one_statement():
    assert _bounded("SELECT 1;", 10) == "SELECT * FROM (SELECT 1) AS q LIMIT 11"
    assert _bounded("EXPLAIN SELECT 1", 10) == "EXPLAIN SELECT 1"
    with pytest.raises(ValueError, match="exactly one"):
        _bounded("SELECT 1; SELECT 2", 10)
    con = duckdb.connect()
    assert con.execute(_bounded("SELECT * FROM range(100) ORDER BY range DESC", 3)).fetchall() == [(99,), (98,), (97,), (96,)]
    con.execute("CREATE TABLE logs (a INT)")
    for q in ("DESCRIBE logs", "SHOW TABLES", "SUMMARIZE logs"):  # DuckDB parses these as SELECTs: wrapping works
        assert con.execute(_bounded(q, 3)).fetchall()
