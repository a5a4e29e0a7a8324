"""airflow-provider-pulsarstate: shared state for pipelines, kept in an Apache Pulsar topic.

Laid out like an Airflow provider: ``hooks`` (the one hook every other part goes through),
``operators``, ``spark`` (PySpark helpers, no Airflow imports), ``testing`` (a harness for your own
tests) and ``engine``, the state engine itself, which imports nothing from Airflow.

This module is the public API of the engine: every name in ``__all__`` is importable from here
(``from airflow_provider_pulsarstate import StateTable``) and stays importable from here across
releases; deeper paths are implementation detail. Names load on first use, so importing the
package costs nothing until one of them is touched (the Airflow components that only read the
provider's metadata never load the engine).
"""

import typing as _typing

from airflow_provider_pulsarstate._lazy import lazy_exports as _lazy_exports

__version__ = "0.1.0"

if _typing.TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.backends import AcquireMode, Backend, open_backend
    from airflow_provider_pulsarstate.engine.config import ConnectionConfig
    from airflow_provider_pulsarstate.engine.errors import (
        BackendUnavailableError,
        CheckpointError,
        ClosedError,
        CommitNotFoundError,
        ConfigurationError,
        CorruptEntryError,
        LeadershipError,
        LeaseError,
        LeaseFencedError,
        LeaseLostError,
        LeaseNotGrantedError,
        LeaseTimeoutError,
        LogLostError,
        MessageNotFoundError,
        MissingExtraError,
        OffsetError,
        OffsetIndexUnavailableError,
        OffsetOutOfRangeError,
        OperationTimeoutError,
        PulsarStateError,
        RetentionPolicyError,
        SerializationError,
        SourceOffsetsConflictError,
        TableFeedError,
        TableNotFoundError,
        UnknownOutcomeError,
        UnknownPartitionError,
        UnknownScopePredicateError,
        UnknownTopicError,
        ValueTooLargeError,
        ViewClosedError,
        ViewConflictError,
        ViewError,
        ViewGuardError,
        ViewNotFoundError,
        ViewNotSealedError,
        ViewScopeError,
        ViewSealMismatchError,
        ViewStagedRowError,
        WriteId,
        WriterBusyError,
        WriterFencedError,
        XComEntryNotFoundError,
        XComError,
        XComReferenceError,
        XComStoreUnavailableError,
        XComValueTooLargeError,
    )
    from airflow_provider_pulsarstate.engine.manager import Change, SharedStateManager
    from airflow_provider_pulsarstate.engine.offsets import (
        PullConsumer,
        PulledMessage,
        PullResult,
        TopicPublisher,
        create_topic,
        open_publisher,
    )
    from airflow_provider_pulsarstate.engine.recipes.lease import Lease, LeaseInfo, LeaseKeeper, Leases, LeaseTransition
    from airflow_provider_pulsarstate.engine.recipes.map import MapChange, PulsarMap
    from airflow_provider_pulsarstate.engine.recipes.table import (
        StateTable,
        TableChange,
        ViewInfo,
        ViewPlan,
        ViewResult,
        ViewStager,
        register_scope_predicate,
    )
    from airflow_provider_pulsarstate.engine.writes import WriteOutcome

_ERRORS = (
    "BackendUnavailableError",
    "CheckpointError",
    "ClosedError",
    "CommitNotFoundError",
    "ConfigurationError",
    "CorruptEntryError",
    "LeadershipError",
    "LeaseError",
    "LeaseFencedError",
    "LeaseLostError",
    "LeaseNotGrantedError",
    "LeaseTimeoutError",
    "LogLostError",
    "MessageNotFoundError",
    "MissingExtraError",
    "OffsetError",
    "OffsetIndexUnavailableError",
    "OffsetOutOfRangeError",
    "OperationTimeoutError",
    "PulsarStateError",
    "RetentionPolicyError",
    "SerializationError",
    "SourceOffsetsConflictError",
    "TableFeedError",
    "TableNotFoundError",
    "UnknownOutcomeError",
    "UnknownPartitionError",
    "UnknownScopePredicateError",
    "UnknownTopicError",
    "ValueTooLargeError",
    "ViewClosedError",
    "ViewConflictError",
    "ViewError",
    "ViewGuardError",
    "ViewNotFoundError",
    "ViewNotSealedError",
    "ViewScopeError",
    "ViewSealMismatchError",
    "ViewStagedRowError",
    "WriteId",
    "WriterBusyError",
    "WriterFencedError",
    "XComEntryNotFoundError",
    "XComError",
    "XComReferenceError",
    "XComStoreUnavailableError",
    "XComValueTooLargeError",
)

# Public name -> the module (under this package) it is loaded from on first use.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("AcquireMode", "Backend", "open_backend"), "engine.backends"),
    "ConnectionConfig": "engine.config",
    **dict.fromkeys(_ERRORS, "engine.errors"),
    **dict.fromkeys(("Change", "SharedStateManager"), "engine.manager"),
    **dict.fromkeys(
        ("PulledMessage", "PullConsumer", "PullResult", "TopicPublisher", "create_topic", "open_publisher"),
        "engine.offsets",
    ),
    **dict.fromkeys(("Lease", "LeaseInfo", "LeaseKeeper", "Leases", "LeaseTransition"), "engine.recipes.lease"),
    **dict.fromkeys(("MapChange", "PulsarMap"), "engine.recipes.map"),
    **dict.fromkeys(
        ("StateTable", "TableChange", "ViewInfo", "ViewPlan", "ViewResult", "ViewStager", "register_scope_predicate"),
        "engine.recipes.table",
    ),
    "WriteOutcome": "engine.writes",
}


def get_provider_info() -> dict[str, _typing.Any]:
    """Airflow provider metadata (entry point ``apache_airflow_provider``)."""
    from airflow_provider_pulsarstate.provider_info import provider_info

    return provider_info()


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY, globals())

__all__ = sorted([*_LAZY, "get_provider_info"])
