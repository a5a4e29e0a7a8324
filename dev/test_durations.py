"""Refresh ``tests/durations.json`` from a test run's JUnit report, so the next runs start their
slowest test modules first. Usage: ``python dev/test_durations.py [.artifacts/junit.xml]``.

``./dev/test`` writes the report. Each test's time is its setup, call and teardown (JUnit's
``time``); the file keeps the tests that took at least a second, rounded to a tenth. With
``--cpu N`` it also prints the N test modules that used the most CPU (each test's ``cpu_seconds``
property: its process and the children it waited for), the measure that counts on a machine whose
CPUs the suite keeps busy. With ``--timeline N`` it prints each xdist worker's span and the last N
test modules it ran (the ``started`` and ``worker`` properties): what kept the run going at its end.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"
MIN_SECONDS = 1.0


def _cases(report: Path) -> Iterator[tuple[str, ET.Element]]:
    """(test node id, its JUnit testcase element) for every test case of the report."""
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = case.get("name", "")
        at = name.rfind("@")
        if at > name.rfind("]"):  # the xdist_group suffix pytest-xdist adds: not part of the test's id
            name = name[:at]
        # pytest's JUnit classname is the dotted path, with a test class as its last part when there is one
        path_parts = [p for p in module if p]
        cls = [path_parts.pop()] if path_parts and path_parts[-1][:1].isupper() else []
        yield "/".join(path_parts) + ".py::" + "::".join([*cls, name]), case


def durations(report: Path) -> dict[str, float]:
    """Test node id -> seconds, for every test case of the JUnit report."""
    return {nodeid: round(float(case.get("time", "0") or 0), 1) for nodeid, case in _cases(report)}


def _properties(report: Path, name: str) -> dict[str, str]:
    """Test node id -> the value of its JUnit property ``name``, for the test cases that carry it."""
    out: dict[str, str] = {}
    for nodeid, case in _cases(report):
        for prop in case.iter("property"):
            if prop.get("name") == name:
                out[nodeid] = prop.get("value", "")
    return out


def cpu_seconds(report: Path) -> dict[str, float]:
    """Test node id -> CPU seconds, for the test cases that carry the ``cpu_seconds`` property."""
    return {nodeid: float(value or 0) for nodeid, value in _properties(report, "cpu_seconds").items()}


def print_timeline(report: Path, wall: dict[str, float], last: int) -> None:
    """Per worker: when it started and ended (seconds after the first test started), how long it ran
    tests, and the last ``last`` modules it ran, each with its start and its worker seconds."""
    started = {nodeid: float(value) for nodeid, value in _properties(report, "started").items()}
    workers = _properties(report, "worker")
    if not started:
        print("no timeline: the report's tests carry no `started` property")
        return
    origin = min(started.values())
    runs: dict[str, list[tuple[float, float, str]]] = {}
    for nodeid, at in started.items():
        runs.setdefault(workers.get(nodeid, "?"), []).append((at - origin, wall.get(nodeid, 0.0), nodeid))
    for worker, tests in sorted(runs.items()):
        tests.sort()
        end = max(at + seconds for at, seconds, _ in tests)
        busy = sum(seconds for _, seconds, _ in tests)
        print(f"{worker}: {len(tests)} tests, {tests[0][0]:.0f}-{end:.0f} s, busy {busy:.0f} s")
        modules: list[tuple[str, float, float]] = []  # (module, first start, worker seconds), in the order run
        for at, seconds, nodeid in tests:
            module = nodeid.split("::", 1)[0]
            if modules and modules[-1][0] == module:
                modules[-1] = (module, modules[-1][1], modules[-1][2] + seconds)
            else:
                modules.append((module, at, seconds))
        for module, at, seconds in modules[-last:]:
            print(f"   at {at:6.0f} s  {seconds:6.0f} s  {module}")


def print_cpu_table(cpu: dict[str, float], wall: dict[str, float], top: int) -> None:
    modules: dict[str, list[float]] = {}
    for nodeid, seconds in cpu.items():
        row = modules.setdefault(nodeid.split("::", 1)[0], [0.0, 0.0, 0])
        row[0] += seconds
        row[1] += wall.get(nodeid, 0.0)
        row[2] += 1
    print(f"| module | tests | CPU s | worker s |  (all: {sum(cpu.values()):,.0f} CPU s)")
    print("|---|---:|---:|---:|")
    for module, (c, w, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {module} | {n:.0f} | {c:,.0f} | {w:,.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", type=Path, default=ROOT / ".artifacts" / "junit.xml")
    parser.add_argument("--cpu", type=int, default=0, metavar="N", help="print the N modules using most CPU")
    parser.add_argument("--timeline", type=int, default=0, metavar="N", help="print each worker's last N modules")
    args = parser.parse_args(argv)
    wall = durations(args.report)
    if args.cpu:
        print_cpu_table(cpu_seconds(args.report), wall, args.cpu)
    if args.timeline:
        print_timeline(args.report, wall, args.timeline)
    measured = {k: v for k, v in sorted(wall.items()) if v >= MIN_SECONDS}
    DURATIONS.write_text(json.dumps(measured, indent=1) + "\n")
    total = sum(measured.values())
    print(f"{len(measured)} tests of >= {MIN_SECONDS:.0f} s ({total / 60:.1f} min in all) -> {DURATIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
