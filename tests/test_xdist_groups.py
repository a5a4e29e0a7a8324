"""Tests marked ``xdist_group`` share one worker: the check that refuses a run where they would not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import groups_lost, without_group

pytestmark = pytest.mark.xdist_group("xdist-groups")


def _item(nodeid: str, *groups: str) -> Any:
    marks = [SimpleNamespace(args=(g,), kwargs={}) for g in groups]
    return SimpleNamespace(nodeid=nodeid, iter_markers=lambda name: iter(marks if name == "xdist_group" else []))


def test_a_grouped_test_without_its_suffix_is_reported_and_nothing_else() -> None:
    items = [
        _item("t.py::grouped@own-broker", "own-broker"),
        _item("t.py::lost", "own-broker"),
        _item("t.py::two_groups@a_b", "b", "a"),  # pytest-xdist joins several groups, sorted
        _item("t.py::two_groups_one_missing@a", "a", "b"),
        _item("t.py::plain"),
        _item("t.py::param[x@y]"),
    ]
    assert groups_lost(items) == ["t.py::lost", "t.py::two_groups_one_missing@a"]


def test_without_group_drops_only_the_suffix() -> None:
    assert without_group("t.py::test[a]@own-broker") == "t.py::test[a]"
    assert without_group("t.py::test@packaging") == "t.py::test"
    assert without_group("t.py::test[user@host]") == "t.py::test[user@host]"  # a parameter's @
    assert without_group("t.py::test") == "t.py::test"


def test_this_run_groups_this_module(request: pytest.FixtureRequest) -> None:
    """Under ``./dev/test`` (xdist, loadgroup) this test's own id carries its group: the pinned
    pytest and pytest-xdist work together here, not only in the check above."""
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@xdist-groups"), request.node.nodeid
    else:
        assert "@" not in request.node.nodeid  # one process: nothing to group
