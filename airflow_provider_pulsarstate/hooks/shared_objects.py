"""Process-wide shared objects: one back end per connection, and the maps opened on it.

A task process, the API server and the triggerer each open a connection's back end once (one
client, one broker connection) and share it between every map they open. Two kinds of map:

* **pinned** (:func:`shared`): opened once and kept until exit (the legacy whole-deployment maps).
* **borrowed** (:func:`borrow`): opened on demand for one scope (a DAG run's XCom map, an asset's
  state map), counted while in use, closed once idle for ``idle_seconds`` or when more than
  ``max_open`` are open (least recently used first). So a long-lived process holds a bounded
  number of maps whatever the deployment stores, and a task process only its own run's.

A forked child makes its own objects: the parent's client is not fork-safe, so it is left alone,
not closed. Everything still open is closed at exit (:func:`close_all`).

The connection settings a hook reads are kept here too (:func:`cached_config`: in a task process,
reading a connection is a round trip to the execution API); :func:`close_shared_state_maps`
forgets them and the ``[pulsarstate]`` settings, and closes everything.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pulsarstate import provider_settings
from airflow_provider_pulsarstate.engine.backends import Backend, open_backend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig

log = logging.getLogger(__name__)

DEFAULT_MAX_OPEN = 64
"""Borrowed maps a process keeps open at most (the least recently used idle one is closed first)."""

DEFAULT_IDLE_SECONDS = 120.0
"""A borrowed map unused this long is closed."""


@dataclass
class _Held:
    obj: Any
    pid: int
    pinned: bool
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)


_lock = threading.Lock()
_backends: dict[ConnectionConfig, tuple[int, Backend]] = {}
_objects: OrderedDict[tuple[ConnectionConfig, tuple[Any, ...]], _Held] = OrderedDict()
_limits = {"max_open": DEFAULT_MAX_OPEN, "idle_seconds": DEFAULT_IDLE_SECONDS}
_reaper: list[threading.Thread] = []


def set_limits(*, max_open: int | None = None, idle_seconds: float | None = None) -> None:
    """Change the bound on borrowed maps (tests; a process with unusual needs)."""
    with _lock:
        if max_open is not None:
            if max_open < 1:
                raise ValueError(f"max_open must be >= 1, not {max_open!r}")
            _limits["max_open"] = max_open
        if idle_seconds is not None:
            if not idle_seconds > 0:
                raise ValueError(f"idle_seconds must be > 0, not {idle_seconds!r}")
            _limits["idle_seconds"] = idle_seconds


def backend_for(config: ConnectionConfig) -> Backend:
    """This process's back end of ``config`` (opened once; no I/O until first use)."""
    pid = os.getpid()
    with _lock:
        return _backend_locked(config, pid)


def _backend_locked(config: ConnectionConfig, pid: int) -> Backend:
    held = _backends.get(config)
    if held is None or held[0] != pid:
        held = (pid, open_backend(config))
        _backends[config] = held
    return held[1]


def _backend_arg(config: ConnectionConfig, pid: int, lazy: bool) -> Any:
    """What a factory gets: the back end, or (``lazy``) a callable opening it at first call."""
    return (lambda: backend_for(config)) if lazy else _backend_locked(config, pid)


def shared(
    config: ConnectionConfig, key: tuple[Any, ...], factory: Callable[[Any], Any], *, lazy_backend: bool = False
) -> Any:
    """The pinned object ``factory(backend)`` made for (connection, ``key``): made once per
    process, kept until exit. ``lazy_backend``: the factory gets a callable that opens the back
    end when first called (outside this module's lock), for objects that may never need it."""
    pid = os.getpid()
    with _lock:
        held = _objects.get((config, key))
        if held is not None and held.pid == pid:
            return held.obj
        made = factory(_backend_arg(config, pid, lazy_backend))
        _objects[(config, key)] = _Held(made, pid, pinned=True)
        return made


@contextlib.contextmanager
def borrow(
    config: ConnectionConfig, key: tuple[Any, ...], factory: Callable[[Any], Any], *, lazy_backend: bool = False
) -> Iterator[Any]:
    """Use the borrowed object of (connection, ``key``), opening it with ``factory(backend)`` when
    it is not open. It is never closed while borrowed; afterwards it stays open for the next
    caller until idle or evicted. ``lazy_backend`` as for :func:`shared`."""
    pid = os.getpid()
    with _lock:
        held = _objects.get((config, key))
        if held is None or held.pid != pid:
            held = _Held(factory(_backend_arg(config, pid, lazy_backend)), pid, pinned=False)
            _objects[(config, key)] = held
        _objects.move_to_end((config, key))
        held.users += 1
        held.last_used = time.monotonic()
        _start_reaper_locked()
    try:
        yield held.obj
    finally:
        with _lock:
            held.users -= 1
            held.last_used = time.monotonic()
            doomed = _reap_locked(pid)
        _close_all_of(doomed)


def discard_topic(topic: str) -> int:
    """Close this process's borrowed objects on ``topic`` that nobody uses now (before the topic
    is deleted, so that none of them reconnects and re-creates it); returns how many."""
    pid = os.getpid()
    with _lock:
        doomed = [
            k
            for k, h in _objects.items()
            if not h.pinned and h.pid == pid and not h.users and len(k[1]) > 1 and k[1][1] == topic
        ]
        objects = [_objects.pop(k).obj for k in doomed]
    _close_all_of(objects)
    return len(objects)


def open_count() -> int:
    """How many borrowed objects this process has open (for tests and the UI)."""
    pid = os.getpid()
    with _lock:
        return sum(1 for h in _objects.values() if not h.pinned and h.pid == pid)


def _reap_locked(pid: int) -> list[Any]:
    """Remove (and return, to be closed outside the lock) the idle and the over-limit borrowed objects."""
    now = time.monotonic()
    borrowed = [(k, h) for k, h in _objects.items() if not h.pinned and h.pid == pid]
    doomed: list[Any] = []
    excess = len(borrowed) - _limits["max_open"]
    for k, h in borrowed:  # least recently used first
        if h.users:
            continue
        if excess > 0 or now - h.last_used >= _limits["idle_seconds"]:
            del _objects[k]
            doomed.append(h.obj)
            excess -= 1
    return doomed


def _start_reaper_locked() -> None:
    """A daemon thread that closes idle borrowed objects of long-lived processes (one per process)."""
    if _reaper and _reaper[0].is_alive() and getattr(_reaper[0], "pid", None) == os.getpid():
        return
    thread = threading.Thread(target=_reap_forever, name="pulsarstate-map-reaper", daemon=True)
    thread.pid = os.getpid()  # type: ignore[attr-defined]
    _reaper[:] = [thread]
    thread.start()


def _reap_forever() -> None:
    pid = os.getpid()
    while True:
        time.sleep(min(5.0, max(0.05, _limits["idle_seconds"] / 4)))
        with _lock:
            doomed = _reap_locked(pid)
        _close_all_of(doomed)


def _close_all_of(objects: list[Any]) -> None:
    for obj in objects:
        try:
            obj.close()
        except Exception:
            log.warning("closing %r failed", obj, exc_info=True)


@atexit.register
def close_all() -> None:
    """Close this process's shared objects and back ends (also run at exit)."""
    pid = os.getpid()
    with _lock:
        objects = [h.obj for h in _objects.values() if h.pid == pid]
        backends = [b for p, b in _backends.values() if p == pid]
        _objects.clear()
        _backends.clear()
    _close_all_of([*reversed(objects), *backends])


_configs_lock = threading.Lock()
_configs: dict[str, tuple[int, ConnectionConfig]] = {}  # conn id -> (pid, config), found without reading the connection


def cached_config(conn_id: str, load: Callable[[], ConnectionConfig]) -> ConnectionConfig:
    """The config of connection ``conn_id``, ``load()``-ed once per process (a forked child loads
    its own); :func:`close_shared_state_maps` forgets it."""
    pid = os.getpid()
    with _configs_lock:
        held = _configs.get(conn_id)
    if held is not None and held[0] == pid:
        return held[1]
    config = load()
    with _configs_lock:
        _configs[conn_id] = (pid, config)
    return config


@atexit.register
def close_shared_state_maps() -> None:
    """Close this process's shared state maps and their back ends, and forget the connections and
    ``[pulsarstate]`` settings read once per process (also run at exit)."""
    with _configs_lock:
        _configs.clear()
    provider_settings.forget_settings()
    close_all()
