"""The write side of staging: ViewStager's canonical bytes (fast path = table_ops.canonical, byte for
byte), pipelined batches that are durable once flush/close return, and a stager that refuses rows
after a failed append."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.backends.base import Backend, RawWriter
from airflow_provider_pulsarstate.engine.errors import SerializationError, UnknownOutcomeError
from airflow_provider_pulsarstate.engine.recipes.table import StateTable
from airflow_provider_pulsarstate.engine.recipes.table_ops import canonical, check_record, fast_canonical
from airflow_provider_pulsarstate.engine.recipes.view_staging import ViewStager, read_staged, staging_topic
from airflow_provider_pulsarstate.testing.harness import ForwardingBackend

# ---------------------------------------------------------------------------------- canonical bytes
EDGE_FLOATS = [
    1e16,
    -1e16,
    1e16 + 2.0,
    9999999999999998.0,
    4503599627370495.5,
    -0.0,
    0.0,
    1.5e-7,
    -1.5e-7,
    1e-4,
    -1e-4,
    math.nextafter(1e-4, 0),
    math.nextafter(1e-4, 1),
    9.999999999999999e-05,
    math.nextafter(1e16, 0),
    0.1,
    0.30000000000000004,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    2.0**53,
    2.0**53 + 2,
    2.0**63,
    -(2.0**63),
    math.nextafter(2.0**63, 0),
    2.0**64,
    1e300,
    123456789.123456789,
    float("nan"),
    float("inf"),
    float("-inf"),
]
EDGE_INTS = [0, -1, 2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**30)]
CHARS = [
    "a",
    "Z",
    "0",
    " ",
    '"',
    "\\",
    "/",
    "\x00",
    "\x01",
    "\x08",
    "\t",
    "\n",
    "\x0b",
    "\x0c",
    "\r",
    "\x1f",
    "\x7f",
    "\x80",
    "é",
    "ß",
    "\u2028",
    "\u2029",
    "\ud7ff",
    "\ue000",
    "\ufeff",
    "\uffff",
    "€",
    "中",
    "\U0001f600",
    "\U0010ffff",
]


def _random_float(rng: random.Random) -> float:
    pick = rng.randrange(6)
    if pick == 0:
        return struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]  # any bit pattern (NaNs too)
    if pick == 1:
        return rng.uniform(-1e6, 1e6)
    if pick == 2:
        return round(rng.uniform(-1e4, 1e4), rng.randrange(0, 7))  # prices
    if pick == 3:
        return rng.choice([-1, 1]) * 10.0 ** rng.uniform(-12, 22)  # every decade around both thresholds
    if pick == 4:
        return float(rng.randrange(-(2**64), 2**64))  # integral floats, some beyond 64 bits
    return rng.choice(EDGE_FLOATS)


def _random_str(rng: random.Random) -> str:
    text = "".join(rng.choice(CHARS) for _ in range(rng.randrange(0, 8)))
    if rng.random() < 0.01:
        text += "\ud800"  # a lone surrogate: not encodable
    return text


def _random_value(rng: random.Random) -> Any:
    pick = rng.randrange(7)
    if pick == 0:
        return _random_float(rng)
    if pick == 1:
        return rng.choice([rng.randrange(-(2**70), 2**70), rng.randrange(-1000, 1000), rng.choice(EDGE_INTS)])
    if pick == 2:
        return rng.choice([True, False])
    if pick == 3:
        return None
    return _random_str(rng)


def _expected(record: dict[str, Any]) -> bytes | type[Exception]:
    try:
        check_record("k", record)
        return canonical(record)
    except (SerializationError, TypeError, ValueError) as exc:
        return type(exc)


def test_fast_canonical_spells_every_record_as_canonical_does() -> None:
    """200,000 random records: whenever the fast path answers, its bytes are canonical()'s; it
    never answers for a record canonical() rejects; and it answers for most records."""
    rng = random.Random(11)
    fast = 0
    for _ in range(200_000):
        record = {
            _random_str(rng) if rng.random() < 0.3 else rng.choice("abcdefgh"): _random_value(rng)
            for _ in range(rng.randrange(0, 6))
        }
        expected = _expected(dict(record))
        got = fast_canonical(record)
        if got is not None:
            fast += 1
            assert got == expected, record
    assert fast > 120_000  # the fast path is the common path, not a rare one


@pytest.mark.parametrize("value", EDGE_FLOATS + EDGE_INTS + CHARS + [True, False, None, "", "\ud800"])
def test_stager_bytes_equal_canonical_on_edge_values(value: Any) -> None:
    record = {"v": value, "é": 1.25, "\U0001f600": "x", "A": 2.0}
    expected = _expected(dict(record))
    stager = ViewStager(_NullBackend(), "persistent://public/default/t", "v1")
    if isinstance(expected, bytes):
        stager.set("k", record)
        assert stager._buffer == {"k": expected}
        assert record["A"] == 2.0  # the caller's record is not changed
    else:
        with pytest.raises(SerializationError, match="key 'k'"):
            stager.set("k", record)
        assert stager.rows_staged == 0


@pytest.mark.parametrize(
    "key, record, problem",
    [
        ("", {"a": 1}, "row key '' must be a non-empty str"),
        (3, {"a": 1}, "row key 3 must be a non-empty str"),
        ("k", [("a", 1)], "must be a dict of fields, got list"),
        ("k", {1: "a"}, "field name 1 is not a str"),
        ("k", {"a": [1]}, "field 'a' holds list, not a JSON scalar"),
        ("k", {"a": float("nan")}, "is not JSON"),
    ],
)
def test_stager_rejects_bad_rows_naming_them(key: Any, record: Any, problem: str) -> None:
    stager = ViewStager(_NullBackend(), "persistent://public/default/t", "v1")
    with pytest.raises(SerializationError, match=problem.replace("(", r"\(").replace("[", r"\[")):
        stager.set(key, record)
    assert stager.rows_staged == 0 and stager.pending == 0


# ---------------------------------------------------------------------------------- batches
def test_pipelined_batches_land_in_order_and_flush_waits_for_them(backend: Backend, topic: str) -> None:
    with StateTable(backend, topic, writer_idle_timeout=0.1) as table:
        view = table.create_view()
        stager = ViewStager(backend, table.topic, view.view_id, batch_rows=10, max_pending=3)
        for i in range(95):
            stager.set(f"k{i % 40:02d}", {"i": i})  # each key staged up to 3 times: the last must win
        stager.flush()
        assert stager.pending == 0 and not stager._pending  # every batch acknowledged
        sealed = {stager.stager_id: stager.rows_staged}
        rows = read_staged(
            backend,
            view_id=view.view_id,
            topic=staging_topic(table.topic, view.view_id),
            sealed=sealed,
            in_scope=None,
            describe_scope="",
            timeout=10.0,
        )
        assert rows == {f"k{k:02d}": canonical({"i": max(i for i in range(95) if i % 40 == k)}) for k in range(40)}
        stager.set("late", {"i": 1})
        stager.close()
        table.seal(view.view_id, stagers=[stager])
        result = table.apply(view.view_id)
        assert (result.set, stager.rows_staged) == (41, 96)
        assert table.get("k39", latest=True) == {"i": 79}


def test_a_failed_append_stops_the_stager(backend: Backend, topic: str) -> None:
    failing = _FailingBackend(backend, fail_at=2)
    stager = ViewStager(failing, topic, "v1", batch_rows=5, max_pending=4)
    with pytest.raises(UnknownOutcomeError, match="injected"):
        for i in range(100):
            stager.set(f"k{i}", {"i": i})
    staged = stager.rows_staged
    with pytest.raises(UnknownOutcomeError, match="injected"):  # no more rows: its count is not trustworthy
        stager.set("more", {"i": 0})
    with pytest.raises(UnknownOutcomeError, match="injected"):
        stager.close()
    assert failing.sent <= 1 + 4 + 1  # it stopped sending at the first failure it saw
    assert staged < 100


class _NullBackend(ForwardingBackend):
    """No back end at all: only for rows that never reach a batch."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]


class _FailingBackend(ForwardingBackend):
    """Shared writers whose ``fail_at``-th append is not acknowledged (the waiter raises)."""

    def __init__(self, inner: Backend, *, fail_at: int) -> None:
        super().__init__(inner)
        self.fail_at = fail_at
        self.sent = 0

    def open_shared_writer(self, topic: str, *, compress: bool = False, batching: bool = True) -> RawWriter:
        owner = self
        inner = self.inner.open_shared_writer(topic, compress=compress, batching=batching)

        class Writer(RawWriter):
            def append(self, payloads: Sequence[bytes], *, timeout: float) -> list[Any]:
                return self.append_async(payloads, timeout=timeout)()

            def append_async(self, payloads: Sequence[bytes], *, timeout: float) -> Callable[[], list[Any]]:
                owner.sent += 1
                if owner.sent == owner.fail_at:

                    def lost() -> list[Any]:
                        raise UnknownOutcomeError("injected: no acknowledgement")

                    return lost
                return inner.append_async(payloads, timeout=timeout)

            def close(self) -> None:
                inner.close()

        return Writer()
