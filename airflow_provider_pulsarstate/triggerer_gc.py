"""Freeze what an ``airflow triggerer`` has imported, so that its event loop's full garbage
collections walk only what the triggers made.

A triggerer holds ~220,000 objects once Airflow, its providers and the client libraries are
imported. CPython walks all of them in a full (generation 2) collection, 0.15-0.25 s on the event
loop's thread, and starts one once the objects kept since the last one exceed a quarter of the
survivors: starting a thousand watchers triggers one. Objects moved to the permanent generation by
:func:`gc.freeze` are never walked again (Airflow's DAG processor does this for itself); the
imports' objects live as long as the process anyway, and objects freed by reference counting are
still freed.

Use it for the triggerer only, from a ``sitecustomize.py`` on the triggerer's ``PYTHONPATH``::

    from airflow_provider_pulsarstate.triggerer_gc import freeze_triggerer_imports

    freeze_triggerer_imports()

In any other process (``sys.argv[1]`` is not ``triggerer``) it does nothing and imports nothing.
The triggerer's supervisor goes on making long-lived objects after the imports (its database
models, ~100,000 objects), then forks the trigger runner that runs the triggers' event loop; the
runner keeps the frozen objects and, by a fork hook this call registers, freezes the supervisor's
later ones too as it starts.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Iterable, Sequence

PRELOAD: tuple[str, ...] = (
    "airflow.jobs.triggerer_job_runner",
    "airflow.cli.commands.triggerer_command",
    "airflow_provider_pulsarstate.triggers.state_change",
    "airflow_provider_pulsarstate.triggers.messages",
    "airflow_provider_pulsarstate.triggers.offsets",
    "airflow_provider_pulsarstate.triggers.leadership",
    "airflow_provider_pulsarstate.engine.backends.pulsar",
    "pulsar.asyncio",
)
"""What is imported before the freeze: the triggerer's runner and command, and this provider's
triggers with the client library they load when they start."""


def is_triggerer(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is an ``airflow triggerer`` (or ``python -m airflow triggerer``) command line."""
    return len(argv) > 1 and argv[1] == "triggerer"


def freeze_triggerer_imports(*, argv: Sequence[str] | None = None, preload: Iterable[str] = PRELOAD) -> int:
    """In an ``airflow triggerer`` process: import ``preload``, collect, then :func:`gc.freeze`.

    A process forked afterwards (the trigger runner) freezes again as it starts.
    Returns the number of objects frozen (``gc.get_freeze_count()``), 0 when ``argv`` (default
    ``sys.argv``) is not a triggerer's. If an import fails, nothing is frozen: a warning naming the
    module goes to stderr and the triggerer starts as it would without this call.
    """
    if not is_triggerer(sys.argv if argv is None else argv):
        return 0
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the triggerer must still start
            print(
                f"pulsarstate triggerer_gc: not freezing, importing {name} failed: {exc!r}", file=sys.stderr, flush=True
            )
            return 0
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    # only a freeze in the child: a collection right after a fork could run a finalizer that
    # waits for a lock a thread of the parent held at the fork
    os.register_at_fork(after_in_child=gc.freeze)
    print(f"pulsarstate triggerer_gc: froze {frozen} objects of the triggerer's imports", file=sys.stderr, flush=True)
    return frozen
