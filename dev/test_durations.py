"""Refresh ``tests/durations.json`` from a test run's JUnit report, so the next runs start their
slowest test modules first. Usage: ``python dev/test_durations.py [.artifacts/junit.xml]``.

``./dev/test`` writes the report. Each test's time is its setup, call and teardown (JUnit's
``time``); the file keeps the tests that took at least a second, rounded to a tenth.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"
MIN_SECONDS = 1.0


def durations(report: Path) -> dict[str, float]:
    """Test node id -> seconds, for every test case of the JUnit report."""
    out: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = case.get("name", "")
        # pytest's JUnit classname is the dotted path, with a test class as its last part when there is one
        path_parts = [p for p in module if p]
        cls = [path_parts.pop()] if path_parts and path_parts[-1][:1].isupper() else []
        nodeid = "/".join(path_parts) + ".py::" + "::".join([*cls, name])
        out[nodeid] = round(float(case.get("time", "0") or 0), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", type=Path, default=ROOT / ".artifacts" / "junit.xml")
    args = parser.parse_args(argv)
    measured = {k: v for k, v in sorted(durations(args.report).items()) if v >= MIN_SECONDS}
    DURATIONS.write_text(json.dumps(measured, indent=1) + "\n")
    total = sum(measured.values())
    print(f"{len(measured)} tests of >= {MIN_SECONDS:.0f} s ({total / 60:.1f} min in all) -> {DURATIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
