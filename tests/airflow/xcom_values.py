"""Values the XCom backend tests push and expect back with their exact types (importable by name,
so Airflow's serde can rebuild the dataclass; ``allow_class`` adds it to the allowed classes)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from airflow.sdk.serde import allow_class


@dataclasses.dataclass
class Point:
    x: int
    label: str
    when: datetime.datetime


allow_class(Point)

UTC = datetime.timezone.utc
EXPECTED: dict[str, Any] = {
    "a_datetime": datetime.datetime(2026, 11, 23, 20, 1, 2, 345678, tzinfo=UTC),
    "a_dict": {"rows": 3, "nested": {"ok": True, "none": None}, "day": datetime.date(2026, 11, 23)},
    "a_list": [1, "two", 3.5, None, [4]],
    "a_tuple": (1, "two", (3, 4)),
    "a_set": {"b", "a", "c"},
    "a_dataclass": Point(7, "seven", datetime.datetime(2026, 1, 1, tzinfo=UTC)),
}


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type all the way down (1 == 1.0 == True would hide a lost type)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
