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
"""

from __future__ import annotations

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

__all__ = [
    "AcquireMode",
    "Backend",
    "BackendUnavailableError",
    "Change",
    "CheckpointError",
    "ClosedError",
    "ConfigurationError",
    "ConnectionConfig",
    "CorruptEntryError",
    "MapChange",
    "MissingExtraError",
    "OperationTimeoutError",
    "PulsarMap",
    "PulsarStateError",
    "SerializationError",
    "SharedStateManager",
    "UnknownOutcomeError",
    "ValueTooLargeError",
    "WriteId",
    "WriteOutcome",
    "WriterBusyError",
    "WriterFencedError",
    "open_backend",
]
