"""The parts behind Leases, without a broker: the lease log's codec, the fold with its local
observations, and the acquire/renew/release decisions on a given state (live: test_leases.py)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.errors import LeaseLostError
from airflow_provider_pulsarstate.engine.recipes.lease_codec import (
    deserialize_image,
    parse_lease_op,
    serialize_image,
)
from airflow_provider_pulsarstate.engine.recipes.lease_observer import LeaseObserver, LeaseState
from airflow_provider_pulsarstate.engine.recipes.lease_ops import acquire_ops, release_ops, renew_ops
from airflow_provider_pulsarstate.engine.recipes.lease_records import Lease

T = "persistent://public/default/leases"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def acquire(name: str, holder: str, token: int, *, at: float = 0.0, ttl: float = 10.0) -> dict[str, Any]:
    return {"op": "acquire", "name": name, "holder": holder, "token": token, "ttl": ttl, "at": at}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b"[]", "JSON object"),
        (b'{"op": "steal"}', "'op'"),
        (b'{"op": "acquire", "name": "", "holder": "h", "token": 1, "ttl": 1, "at": 0}', "'name'"),
        (b'{"op": "acquire", "name": "n", "holder": "h", "token": 0, "ttl": 1, "at": 0}', "'token'"),
        (b'{"op": "acquire", "name": "n", "holder": "h", "token": 1, "ttl": -1, "at": 0}', "'ttl'"),
        (b'{"op": "release", "name": "n", "holder": "h", "token": 1, "at": "x"}', "'at'"),
    ],
)
def test_ops_read_back_are_checked_field_by_field(data: bytes, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_lease_op(data)


def test_the_fold_ignores_ops_that_do_not_fit_and_records_transitions() -> None:
    clock = Clock()
    obs, state = LeaseObserver(T, clock), LeaseState()
    obs.apply(state, acquire("n", "a", 1, at=0.0), 0)
    obs.apply(state, acquire("n", "b", 3, at=1.0), 1)  # not the next token: ignored
    obs.apply(state, {"op": "renew", "name": "n", "holder": "b", "token": 1, "ttl": 5.0, "at": 2.0}, 2)  # not b's
    assert (state["n"].holder, state["n"].token, state["n"].offset) == ("a", 1, 0)
    obs.apply(state, acquire("n", "b", 2, at=20.0), 3)  # after a's ttl: a expired
    obs.apply(state, {"op": "release", "name": "n", "holder": "b", "token": 2, "at": 21.0}, 4)
    events = [(t.event, t.holder, t.token) for t in obs.transitions("n", 10)]
    assert events == [("released", "b", 2), ("acquired", "b", 2), ("expired", "a", 1), ("acquired", "a", 1)]
    assert state["n"].holder is None and state["n"].transitions == 1


def test_the_image_round_trips_and_counts_as_observed_at_load() -> None:
    clock = Clock()
    obs, state = LeaseObserver(T, clock), LeaseState()
    obs.apply(state, acquire("n", "a", 1), 7)
    data = serialize_image(state)
    assert deserialize_image(data) == state
    clock.now += 4.0
    fresh = LeaseObserver(T, clock)
    info = fresh.info(fresh.load_image(data), "n")
    assert info is not None and info.observed_age == 0.0 and info.offset == 7
    with pytest.raises(ValueError, match="'offset'"):
        deserialize_image(data.replace(b",7]", b",-7]"))


def test_an_acquire_waits_for_expiry_as_observed_here_unless_it_steals() -> None:
    clock = Clock()
    obs, state = LeaseObserver(T, clock), LeaseState()
    obs.apply(state, acquire("n", "a", 1, ttl=10.0), 0)
    outcome: dict[str, Any] = {}
    clock.now += 4.0
    assert acquire_ops(obs, "n", "b", 10.0, False, outcome)(state) == []
    assert outcome == {"expires_in": 6.0}
    [stolen] = acquire_ops(obs, "n", "b", 10.0, True, outcome)(state)
    assert (stolen["token"], outcome["stolen"], outcome["expired"]) == (2, True, False)
    clock.now += 7.0
    [taken] = acquire_ops(obs, "n", "b", 10.0, False, outcome)(state)
    assert (taken["token"], outcome["stolen"], outcome["expired"], outcome["previous"]) == (2, False, True, "a")


def test_renew_and_release_act_only_under_the_token_the_log_holds() -> None:
    clock = Clock()
    obs, state = LeaseObserver(T, clock), LeaseState()
    obs.apply(state, acquire("n", "a", 1), 0)
    first = Lease("n", "a", 1, 10.0, T)
    assert renew_ops(obs, first, 5.0)(state)[0]["ttl"] == 5.0
    obs.apply(state, acquire("n", "a", 2), 1)  # re-acquired: token 1 is superseded
    with pytest.raises(LeaseLostError, match="held by 'a' with token 2"):
        renew_ops(obs, first, 10.0)(state)
    done = [True]
    assert release_ops(first, done)(state) == [] and done == [False]
    assert release_ops(Lease("n", "a", 2, 10.0, T), done)(state)[0]["op"] == "release" and done == [True]
    obs.granted("n", 2, clock.now, 10.0)
    clock.now += 3.0
    assert obs.remaining(Lease("n", "a", 2, 10.0, T)) == 7.0
    obs.granted("n", 2, clock.now - 5.0, 10.0, renewal=True)  # an older renew answered late: ignored
    assert obs.remaining(Lease("n", "a", 2, 10.0, T)) == 7.0
