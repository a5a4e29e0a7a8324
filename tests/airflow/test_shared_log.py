"""SharedLog: one line per key and interval, the next one saying how many were left out."""

from __future__ import annotations

import logging
import time

import pytest

from airflow_provider_pulsarstate.triggers.shared_log import SharedLog


def test_one_line_per_key_and_interval_then_the_count_left_out(caplog: pytest.LogCaptureFixture) -> None:
    log = SharedLog(logging.getLogger("pulsarstate.test.shared_log"), interval=0.2)
    with caplog.at_level(logging.INFO, logger="pulsarstate.test.shared_log"):
        written = [log.warning(("t", "E"), "table %s failed", "t") for _ in range(1000)]
        assert log.info("other", "another key") is True
        time.sleep(0.25)
        assert log.warning(("t", "E"), "table %s failed", "t") is True
    assert written.count(True) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "table t failed",
        "another key",
        caplog.records[2].getMessage(),
    ]
    assert caplog.records[2].getMessage().startswith("table t failed (and 999 more like it in the last ")


def test_a_disabled_level_is_neither_written_nor_counted(caplog: pytest.LogCaptureFixture) -> None:
    log = SharedLog(logging.getLogger("pulsarstate.test.shared_log.quiet"))
    with caplog.at_level(logging.WARNING, logger="pulsarstate.test.shared_log.quiet"):
        assert log.info("k", "not at this level") is False
        assert log.warning("k", "written") is True
    assert [r.getMessage() for r in caplog.records] == ["written"]
