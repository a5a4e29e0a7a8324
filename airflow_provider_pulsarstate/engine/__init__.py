"""The state engine: an op log on a topic, replayed into shared state. It imports nothing from Airflow.

* :mod:`.backends`: the log contract and its two back ends (a Pulsar broker, the embedded SQLite log);
* :mod:`.envelope`, :mod:`.wal` (the write-ahead log): frames, records, epochs and offsets, shared by both back ends;
* :mod:`.manager`: :class:`SharedStateManager` (PIP-137), a façade over :mod:`.state` (replica,
  committer, writer custody, listeners, workers, ops); :mod:`.writes`: writes in flight and
  outcomes in doubt; :mod:`.checkpoint`: state images;
* :mod:`.recipes`: small classes over the manager (:class:`PulsarMap`, ``StateTable`` with temp views);
* :mod:`.config`, :mod:`.errors`: connection settings and the one exception hierarchy.

The rule "the engine and the Spark helpers import nothing from Airflow; the Airflow layer reaches
the engine through the hook" is checked by import-linter (``[tool.importlinter]`` in pyproject.toml,
run by the test suite).

Names load on first use: importing one engine module (``engine.config``, as the provider's metadata
does in every Airflow process) does not load the others.
"""

import typing as _typing

from airflow_provider_pulsarstate._lazy import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.backends import AcquireMode, Backend, open_backend
    from airflow_provider_pulsarstate.engine.config import ConnectionConfig
    from airflow_provider_pulsarstate.engine.errors import (
        BackendUnavailableError,
        CheckpointError,
        ClosedError,
        ConfigurationError,
        CorruptEntryError,
        MissingExtraError,
        OperationTimeoutError,
        PulsarStateError,
        SerializationError,
        UnknownOutcomeError,
        ValueTooLargeError,
        WriteId,
        WriterBusyError,
        WriterFencedError,
    )
    from airflow_provider_pulsarstate.engine.manager import Change, SharedStateManager
    from airflow_provider_pulsarstate.engine.recipes.map import MapChange, PulsarMap
    from airflow_provider_pulsarstate.engine.writes import WriteOutcome

# Name -> the module (under this package) it is loaded from on first use.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("AcquireMode", "Backend", "open_backend"), "backends"),
    "ConnectionConfig": "config",
    **dict.fromkeys(
        (
            "BackendUnavailableError",
            "CheckpointError",
            "ClosedError",
            "ConfigurationError",
            "CorruptEntryError",
            "MissingExtraError",
            "OperationTimeoutError",
            "PulsarStateError",
            "SerializationError",
            "UnknownOutcomeError",
            "ValueTooLargeError",
            "WriteId",
            "WriterBusyError",
            "WriterFencedError",
        ),
        "errors",
    ),
    **dict.fromkeys(("Change", "SharedStateManager"), "manager"),
    **dict.fromkeys(("MapChange", "PulsarMap"), "recipes.map"),
    "WriteOutcome": "writes",
}


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY, globals())

__all__ = sorted(_LAZY)
