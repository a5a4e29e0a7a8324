"""The provider's own configuration section, ``[pulsarstate]`` (also ``AIRFLOW__PULSARSTATE__*``).

It configures the two backends Airflow itself loads by class name, which take no arguments: the
XCom backend (``[core] xcom_backend``) and the task/asset state-store backend (``[state_store]
backend`` / ``[workers] state_store_backend``). :data:`OPTIONS` is what ``get_provider_info()``
declares (``airflow config list`` shows it); :func:`load_settings` reads and checks it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.airflow_internals import is_blocked_db_url

SECTION = "pulsarstate"

LEGACY_KEY_NAMESPACE = "airflow"
"""The key namespace of earlier versions' default: entries written under it stay readable."""

OPTIONS: dict[str, dict[str, Any]] = {
    "conn_id": {
        "description": "The pulsarstate connection the XCom and state-store backends use.\n",
        "type": "string",
        "example": "pulsarstate_default",
        "default": "pulsarstate_default",
    },
    "key_namespace": {
        "description": "Name of this deployment's XCom and state entries (part of every key and run-map\n"
        "topic), so that several Airflow deployments can share a Pulsar namespace without seeing or\n"
        "cleaning up each other's entries. Empty (the default): derived from the metadata DB's address\n"
        "([database] sql_alchemy_conn), which every component of one deployment shares; set it\n"
        "explicitly (the same everywhere) where workers do not see that address.\n",
        "type": "string",
        "example": "prod",
        "default": "",
    },
    "xcom_topic": {
        "description": "Topic of the PulsarMap that holds XCom values (a short name uses the connection's\n"
        "tenant and namespace).\n",
        "type": "string",
        "example": "airflow-xcom",
        "default": "airflow-xcom",
    },
    "xcom_max_value_bytes": {
        "description": "Largest serialized XCom value kept in Pulsar. Larger ones follow xcom_oversize.\n",
        "type": "integer",
        "example": "1048576",
        "default": "1048576",
    },
    "xcom_oversize": {
        "description": "What happens to a value over xcom_max_value_bytes: 'db' keeps it in the metadata\n"
        "DB as Airflow's own backend does; 'error' fails the task with an error naming the limit.\n",
        "type": "string",
        "example": "error",
        "default": "db",
    },
    "xcom_layout": {
        "description": "Where XCom values live: 'messages' (the default) appends each value as one immutable\n"
        "message to its run's topic and reads it back by the address kept in the metadata DB (no exclusive\n"
        "writer, no replay); 'map' keeps one PulsarMap per DAG run (every push takes the run map's writer).\n"
        "References of either layout stay readable whatever this says.\n",
        "type": "string",
        "example": "map",
        "default": "messages",
    },
    "xcom_preview_chars": {
        "description": "Characters of a small value shown in the reference the metadata DB (and UI) keep;\n"
        "0 (the default) keeps no value text in the metadata DB.\n",
        "type": "integer",
        "example": "80",
        "default": "0",
    },
    "state_store_topic": {
        "description": "Topic of the PulsarMap that holds task and asset state.\n",
        "type": "string",
        "example": "airflow-state-store",
        "default": "airflow-state-store",
    },
    "state_store_max_value_bytes": {
        "description": "Largest serialized state value; a larger one fails with an error naming the limit.\n",
        "type": "integer",
        "example": "1048576",
        "default": "1048576",
    },
    "state_store_writer_idle_timeout": {
        "description": "Seconds a process keeps the state-store map's writer after its last write. Every\n"
        "task process writes state, so a short hold lets the next one take the writer at once.\n",
        "type": "float",
        "example": "0.2",
        "default": "0.2",
    },
    "teams": {
        "description": "With [core] multi_team: the teams, comma-separated, for processes that cannot read them\n"
        "from the metadata DB (task processes). Each team needs its own key_namespace, state_store_topic and\n"
        "xcom_topic (section <team>=pulsarstate), or the backends refuse to start.\n",
        "type": "string",
        "example": "team_a,team_b",
        "default": "",
    },
}


@dataclass(frozen=True)
class ProviderSettings:
    """The checked ``[pulsarstate]`` options (see :data:`OPTIONS` for their meaning)."""

    conn_id: str = "pulsarstate_default"
    key_namespace: str = LEGACY_KEY_NAMESPACE
    xcom_topic: str = "airflow-xcom"
    xcom_max_value_bytes: int = 1048576
    xcom_oversize: Literal["db", "error"] = "db"
    xcom_preview_chars: int = 0
    xcom_layout: Literal["messages", "map"] = "messages"
    state_store_topic: str = "airflow-state-store"
    state_store_max_value_bytes: int = 1048576
    state_store_writer_idle_timeout: float = 0.2
    teams: str = ""


def load_settings(conf: Any = None) -> ProviderSettings:
    """Read ``[pulsarstate]`` from Airflow's configuration (``conf``: a config parser, for tests).

    :raises ConfigurationError: an option has a bad value; the message names ``[pulsarstate] <option>``.
    """
    if conf is None:
        from airflow.sdk.configuration import conf as airflow_conf  # the same file and env on workers and servers

        conf = airflow_conf
    values: dict[str, Any] = {}
    for name, spec in OPTIONS.items():
        raw = conf.get(SECTION, name, fallback=spec["default"])
        raw = spec["default"] if raw is None or str(raw).strip() == "" else str(raw).strip()
        values[name] = _typed(name, spec["type"], raw)
    if not values["key_namespace"]:
        values["key_namespace"] = derived_key_namespace(conf)
    if values["xcom_oversize"] not in ("db", "error"):
        raise ConfigurationError(f"[{SECTION}] xcom_oversize must be 'db' or 'error', not {values['xcom_oversize']!r}")
    if values["xcom_layout"] not in ("messages", "map"):
        raise ConfigurationError(f"[{SECTION}] xcom_layout must be 'messages' or 'map', not {values['xcom_layout']!r}")
    if "/" in values["key_namespace"]:
        raise ConfigurationError(f"[{SECTION}] key_namespace must not contain '/': {values['key_namespace']!r}")
    return ProviderSettings(**values)


def _typed(name: str, kind: str, raw: str) -> Any:
    """The option's value as its declared type, checked (the error names ``[pulsarstate] <option>``)."""
    if kind == "integer":
        try:
            value: Any = int(raw)
        except ValueError:
            raise ConfigurationError(f"[{SECTION}] {name} must be an integer, not {raw!r}") from None
        least = 0 if name == "xcom_preview_chars" else 1
        if value < least:
            raise ConfigurationError(f"[{SECTION}] {name} must be >= {least}, not {raw!r}")
        return value
    if kind == "float":
        try:
            value = float(raw)
        except ValueError:
            raise ConfigurationError(f"[{SECTION}] {name} must be a number, not {raw!r}") from None
        if not value >= 0 or value == float("inf"):
            raise ConfigurationError(f"[{SECTION}] {name} must be a finite number >= 0, not {raw!r}")
        return value
    return raw


def derived_key_namespace(conf: Any) -> str:
    """``airflow-`` and a digest of ``[database] sql_alchemy_conn``: unique per metadata DB, the
    same on every component that reads that address.

    :raises ConfigurationError: the address is not configured here (then key_namespace must be set).
    """
    try:
        address = conf.get("database", "sql_alchemy_conn", fallback="")
    except Exception:
        address = ""
    if not address or not str(address).strip() or is_blocked_db_url(str(address)):
        # A task process sees a placeholder, never the metadata DB's address: deriving from it would
        # give every deployment's tasks one namespace, and another than the API server's and CLI's.
        raise ConfigurationError(
            f"[{SECTION}] key_namespace is not set and [database] sql_alchemy_conn is not visible in this "
            "process to derive one (Airflow hides it from task processes): set key_namespace to a name "
            "unique to this deployment, the same on every component (AIRFLOW__PULSARSTATE__KEY_NAMESPACE)"
        )
    return "airflow-" + hashlib.sha256(str(address).strip().encode()).hexdigest()[:12]


_cached: list[ProviderSettings] = []


def settings() -> ProviderSettings:
    """:func:`load_settings`, read once per process (reading the options costs ~2 ms, and every
    XCom and state call needs them; Airflow's own config changes need a restart too).
    :func:`forget_settings` makes the next call read them again."""
    if not _cached:
        _cached.append(load_settings())
    return _cached[0]


def forget_settings() -> None:
    """Read ``[pulsarstate]`` again on the next :func:`settings` call (tests that change it)."""
    _cached.clear()
