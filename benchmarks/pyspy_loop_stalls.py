"""Where an asyncio loop's thread was while it stalled, from a py-spy profile of the process.

Record the process (a trigger runner: the ``airflow triggerer`` supervisor's child that is not
``serve-logs``) with idle samples, one profile per thread, in speedscope format::

    py-spy record -p <pid> --idle --threads --rate 50 --nonblocking --format speedscope -o runner.json

then::

    .venv/bin/python benchmarks/pyspy_loop_stalls.py runner.json --started <epoch seconds py-spy started>

A stall is a run of the loop thread's samples outside the selector's ``select`` (the loop busy, or
blocked in a call). Printed: the longest stalls with their wall-clock start and the leaf frames
they spent most samples in, the time the thread spent blocked in log writes (structlog's
``BytesLogger.msg``, logging's stream writes) by the calling frame, and with ``--window`` the
thread's time in that window by kind (idle, blocking log write, this provider's code, Airflow's
trigger creation, Airflow's ``run_trigger``, Airflow's shared streams, other).
Times are sample weights: the profile's time base (samples missed by py-spy shift later ones).
"""

from __future__ import annotations

import argparse
import calendar
import json
import time
from collections import Counter
from typing import Any

LOG_WRITES = ("BytesLogger.msg", "StreamWriter.write")


def _loop_thread(profile: dict[str, Any], name: str) -> dict[str, Any]:
    for p in profile["profiles"]:
        if name in p["name"]:
            return p
    raise SystemExit(f"no thread named {name!r} in the profile: {[p['name'] for p in profile['profiles']]}")


def _label(frame: dict[str, Any]) -> str:
    path = frame.get("file", "").split("/site-packages/")[-1].split("/python3.11/")[-1]
    return f"{frame['name']} ({path}:{frame.get('line')})"


def _kind(names: list[str], files: list[str]) -> str:
    if names and names[-1].endswith("select") and "selectors" in files[-1]:
        return "idle (select)"
    if any(n in LOG_WRITES for n in names[-2:]):
        return "blocking log write"
    if any("airflow_provider_pulsarstate" in f and "/testing/" not in f for f in files):
        return "this provider's code"
    for suffix, kind in (
        ("create_triggers", "Airflow: TriggerRunner.create_triggers"),
        ("run_trigger", "Airflow: TriggerRunner.run_trigger (before the trigger's code)"),
    ):
        if any(n.endswith(suffix) for n in names):
            return kind
    if any("shared_stream" in f for f in files):
        return "Airflow: shared streams"
    return "other"


def _clock(epoch: float) -> str:
    return f"{time.strftime('%H:%M:%S', time.gmtime(epoch))}.{int(epoch % 1 * 100):02d}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("--started", type=float, required=True, help="epoch seconds when py-spy started")
    parser.add_argument("--thread", default="MainThread")
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--window", nargs=2, metavar=("HH:MM:SS.s", "HH:MM:SS.s"), help="UTC, the day py-spy started")
    args = parser.parse_args()
    with open(args.profile) as f:
        profile = json.load(f)
    frames = profile["shared"]["frames"]
    thread = _loop_thread(profile, args.thread)

    stalls: list[tuple[float, float, Counter[str]]] = []
    current: tuple[float, float, Counter[str]] | None = None
    writes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    day = time.gmtime(args.started)[:3]
    window = [calendar.timegm((*day, 0, 0, 0)) + _seconds(w) for w in args.window] if args.window else None
    t = args.started
    for sample, weight in zip(thread["samples"], thread["weights"], strict=True):
        names = [frames[i]["name"] for i in sample]
        files = [frames[i].get("file", "") for i in sample]
        kind = _kind(names, files)
        if kind == "idle (select)":
            if current is not None:
                stalls.append(current)
                current = None
        else:
            if current is None:
                current = (t, 0.0, Counter())
            current = (current[0], current[1] + weight, current[2])
            current[2][_label(frames[sample[-1]]) if sample else "?"] += 1
        if kind == "blocking log write":
            caller = next(
                (
                    _label(frames[i])
                    for i in reversed(sample)
                    if not any(p in frames[i].get("file", "") for p in ("logging", "structlog", "codecs"))
                ),
                "?",
            )
            writes[caller] += weight
        if window and window[0] <= t < window[1]:
            kinds[kind] += weight
        t += weight
    if current is not None:
        stalls.append(current)

    total = sum(thread["weights"])
    print(f"{thread['name']}: {total:.1f}s sampled from {_clock(args.started)} UTC")
    for start, length, leaves in sorted(stalls, key=lambda s: -s[1])[: args.top]:
        print(
            f"  stall {length:6.2f}s from {_clock(start)}: "
            + "; ".join(f"{n}x {leaf}" for leaf, n in leaves.most_common(2))
        )
    print(f"  blocked in log writes: {sum(writes.values()):.2f}s")
    for caller, seconds in writes.most_common(5):
        print(f"    {seconds:6.2f}s called from {caller}")
    if window:
        print(f"  {args.window[0]}-{args.window[1]} UTC by kind:")
        for kind, seconds in kinds.most_common():
            print(f"    {seconds:6.2f}s {kind}")


def _seconds(clock: str) -> float:
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


if __name__ == "__main__":
    main()
