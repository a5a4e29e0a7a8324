"""The package top is the public API: exactly the expected names, each importable, each our own.

Modelled on trio's ``test_exports``: a name added or removed by accident fails here, and so does
a name that resolves to another project's object.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import airflow_provider_pulsarstate as package

INIT = Path(package.__file__)

EXPECTED = {
    # Back ends and the state engine
    "AcquireMode",
    "Backend",
    "Change",
    "ConnectionConfig",
    "SharedStateManager",
    "WriteOutcome",
    "open_backend",
    # Recipes
    "MapChange",
    "PulsarMap",
    "StateTable",
    "TableChange",
    "ViewInfo",
    "ViewPlan",
    "ViewResult",
    "ViewStager",
    "register_scope_predicate",
    "Lease",
    "LeaseInfo",
    "LeaseKeeper",
    "Leases",
    "LeaseTransition",
    # Offsets
    "PullConsumer",
    "PullResult",
    "PulledMessage",
    "TopicPublisher",
    "create_topic",
    "open_publisher",
    # Errors
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
    # Airflow's provider entry point
    "get_provider_info",
}


def test_the_exported_names_are_the_expected_ones() -> None:
    assert len(package.__all__) == len(set(package.__all__)), "a name is listed twice in __all__"
    assert set(package.__all__) - EXPECTED == set(), "new public names: add them to EXPECTED on purpose"
    assert EXPECTED - set(package.__all__) == set(), "public names removed: users' imports would break"


def test_every_exported_name_is_importable_and_ours() -> None:
    for name in package.__all__:
        value = getattr(package, name)
        assert value is not None, name
        module = getattr(value, "__module__", None)
        assert module is not None and (module == package.__name__ or module.startswith(package.__name__ + ".")), (
            f"{name} comes from {module}, not from this package"
        )


def test_star_import_gives_exactly_the_public_api() -> None:
    namespace: dict[str, object] = {}
    exec(f"from {package.__name__} import *", namespace)
    assert {name for name in namespace if name != "__builtins__"} == set(package.__all__)


def test_no_accidental_public_names() -> None:
    # Once every export is loaded, the only other public attributes are the subpackages themselves.
    for name in package.__all__:
        getattr(package, name)
    extra = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and name not in package.__all__ and not isinstance(value, types.ModuleType)
    }
    assert extra == set()
    assert set(package.__all__) <= set(dir(package))


def test_unknown_names_raise_attribute_error() -> None:
    try:
        package.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as error:
        assert "NoSuchThing" in str(error)
    else:
        raise AssertionError("an unknown name resolved")


def test_type_checkers_see_the_same_names() -> None:
    """The ``TYPE_CHECKING`` imports (what mypy and IDEs read) list exactly the lazily loaded names."""
    tree = ast.parse(INIT.read_text())
    seen: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom), ast.unparse(stmt)
                seen.update(alias.asname or alias.name for alias in stmt.names)
    assert seen == set(package.__all__) - {"get_provider_info"}


def test_importing_the_package_stays_light() -> None:
    """``import airflow_provider_pulsarstate`` loads neither the engine nor pulsar-client nor Airflow."""
    code = (
        "import sys, airflow_provider_pulsarstate\n"
        "heavy = ('airflow_provider_pulsarstate.engine', 'pulsar', 'airflow', 'msgspec')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'pulsar', 'airflow', 'msgspec'}"
        " or m.startswith(heavy[0])))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_the_provider_metadata_loads_no_engine_beyond_its_settings() -> None:
    """Every Airflow process reads the provider's metadata (``get_provider_info``) while importing
    Airflow: that must not load the state engine, pulsar-client or msgspec (it cost every
    ``airflow`` command, task and component about half a second of CPU when it did)."""
    code = (
        "import sys\n"
        "from airflow_provider_pulsarstate import get_provider_info\n"
        "get_provider_info()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'pulsar', 'msgspec', 'airflow_provider_pulsarstate'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(eval(result.stdout.strip().splitlines()[-1]))  # a printed list of module names
    engine = {m for m in loaded if m.startswith("airflow_provider_pulsarstate.engine.")}
    assert engine <= {"airflow_provider_pulsarstate.engine.config", "airflow_provider_pulsarstate.engine.errors"}, (
        engine
    )
    assert not {m for m in loaded if m.split(".")[0] in {"pulsar", "msgspec"}}, loaded
