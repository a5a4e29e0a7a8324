"""PulsarStateHook: the one place that turns an Airflow connection into a state back end.

Everything else in the Airflow layer (operators, sensors, triggers, the XCom backend) asks this
hook for its :class:`~airflow_provider_pulsarstate.engine.config.ConnectionConfig`, back end, state
managers and maps, so a connection means the same thing everywhere, including the UI's Test button.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import logging
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_pulsarstate.engine.backends import Backend, open_backend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url, url_secrets
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.leadership import (
    AsyncLeadershipProbe,
    AsyncLeaseObserver,
    Leadership,
    open_async_leadership_probe,
    read_leadership,
)
from airflow_provider_pulsarstate.engine.manager import SharedStateManager
from airflow_provider_pulsarstate.engine.offsets import (
    AsyncOffsetProbe,
    PullConsumer,
    TopicPublisher,
    delete_topic_if_unchanged,
    open_async_probe,
    open_publisher,
)
from airflow_provider_pulsarstate.engine.offsets import create_topic as _create_topic
from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PulsarHttpMessages
from airflow_provider_pulsarstate.engine.recipes.fence_admin import reset_fence
from airflow_provider_pulsarstate.engine.recipes.lease import DEFAULT_LEASE_TOPIC, Lease, LeaseKeeper, Leases
from airflow_provider_pulsarstate.engine.recipes.map import PulsarMap
from airflow_provider_pulsarstate.engine.recipes.shared_table_feed import AsyncTableFeed
from airflow_provider_pulsarstate.engine.recipes.state_store import (
    KEEP,
    AssetStateScope,
    StateScope,
    StateScopeError,
    StateStore,
    StateStoreDataError,
    TaskStateScope,
    parse_state_key,
)
from airflow_provider_pulsarstate.engine.recipes.table import StateTable
from airflow_provider_pulsarstate.engine.recipes.table_feed import CommitChanges, TableFeed, read_commit
from airflow_provider_pulsarstate.engine.recipes.xcom_messages import (
    RunScan,
    XComIdentity,
    XComMessage,
    XComMessageLog,
    is_message_topic,
    message_topic,
    message_topic_prefix,
)
from airflow_provider_pulsarstate.engine.recipes.xcom_store import (
    XComRecord,
    XComStore,
    drop_run_map,
    is_run_topic,
    run_topic,
    run_topic_prefix,
)
from airflow_provider_pulsarstate.engine.topic_stream import (
    INITIAL_POSITIONS,
    PAYLOAD_ENCODINGS,
    REFERENCE_ENCODING,
    PayloadTooLargeError,
    TopicMessage,
    TopicStream,
    open_topic_stream,
    read_topic_message,
)
from airflow_provider_pulsarstate.engine.turns import STARTS_PER_TURN, take_turn
from airflow_provider_pulsarstate.hooks import shared_objects
from airflow_provider_pulsarstate.hooks.airflow_internals import in_server_context
from airflow_provider_pulsarstate.hooks.connection_form import (
    CONN_TYPE,
    FIELD_NAMES,
    HOOK_NAME,
    LEGACY_EXTRA_PREFIX,
    RENAMED_FIELDS,
)
from airflow_provider_pulsarstate.hooks.embedded_check import check_embedded_file
from airflow_provider_pulsarstate.lineage.hook import report_topic

log = logging.getLogger(__name__)

HEALTHCHECK_TOPIC = "__pulsarstate_healthcheck"
"""Short name of the topic :meth:`PulsarStateHook.test_connection` opens a reader on."""

__all__ = [
    "HEALTHCHECK_TOPIC",
    "INITIAL_POSITIONS",
    "KEEP",
    "PAYLOAD_ENCODINGS",
    "REFERENCE_ENCODING",
    "STARTS_PER_TURN",
    "AssetStateScope",
    "Lease",
    "LeaseKeeper",
    "Leases",
    "PayloadTooLargeError",
    "PulsarMap",
    "PulsarStateHook",
    "RunScan",
    "StateScope",
    "StateScopeError",
    "StateStore",
    "StateStoreDataError",
    "TaskStateScope",
    "TopicMessage",
    "TopicStream",
    "XComIdentity",
    "XComMessage",
    "XComMessageLog",
    "XComRecord",
    "XComStore",
    "close_shared_state_maps",
    "config_from_connection",
    "delete_topic_if_unchanged",
    "drop_run_map",
    "is_message_topic",
    "is_run_topic",
    "message_topic",
    "message_topic_prefix",
    "parse_state_key",
    "refuse_multi_host_executor",
    "run_topic",
    "run_topic_prefix",
    "state_scope",
    "take_turn",
]

_STRING_FIELDS = ("service_url", "admin_url", "tenant", "namespace", "auth_token", "tls_trust_certs_file_path")
_BOOL_FIELDS = ("tls_hostname_verification", "allow_plaintext_auth", "allow_other_namespaces")
_default_logged = threading.Event()


class PulsarStateHook(BaseHook):
    """Reach the shared-state back end an Airflow connection of type ``pulsarstate`` names.

    The connection's extra carries the fields of the connection form (see
    :mod:`~airflow_provider_pulsarstate.hooks.connection_form`): ``service_url``, ``admin_url``,
    ``tenant``, ``namespace``, ``auth_token``, ``tls_trust_certs_file_path``, ``operation_timeout``
    (seconds), ``tls_hostname_verification``, ``allow_plaintext_auth`` (formerly
    ``allow_insecure_token``, still read with a DeprecationWarning) and ``allow_other_namespaces``.
    The connection's host stands in for ``service_url`` when it
    is a URL or path, its password for ``auth_token``. For example::

        AIRFLOW_CONN_PULSARSTATE_DEFAULT='{"conn_type": "pulsarstate", "extra": {"service_url": "pulsar://localhost:6650"}}'

    When ``pulsarstate_default`` is not defined at all, the hook uses the embedded single-host log
    under ``$AIRFLOW_HOME/pulsarstate/state.db``, but only under an executor that runs every task
    on this host (``LocalExecutor``): elsewhere each host would get a private "shared" file, so it
    raises :class:`ConfigurationError` instead. That fallback is for task-side code only: in a
    server process (API server, scheduler, the provider's ``airflow pulsarstate`` commands), which
    sees the deployment's connections, a missing ``pulsarstate_default`` is an error naming it and
    how to define it. Any other missing connection is an error everywhere.

    Usage::

        with PulsarStateHook() as hook:
            assignments = hook.get_map("assignments")  # persistent://public/default/assignments
            assignments.put("shard-1", {"owner": "worker-a"})

    Constructing the hook does no I/O; the back end opens on first use and stays open until
    :meth:`close`, which also closes every manager, map, table, pull consumer and publisher the
    hook handed out (an :class:`AsyncOffsetProbe` belongs to its caller, who closes it with
    ``await probe.aclose()``).

    :param pulsarstate_conn_id: the Airflow connection to use.
    """

    conn_name_attr = "pulsarstate_conn_id"
    default_conn_name = "pulsarstate_default"
    conn_type = CONN_TYPE
    hook_name = HOOK_NAME

    def __init__(self, pulsarstate_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pulsarstate_conn_id = pulsarstate_conn_id
        self._lock = threading.Lock()
        self._config: ConnectionConfig | None = None
        self._backend: Backend | None = None
        self._owned: list[
            SharedStateManager[Any, Any] | PulsarMap[Any, Any] | StateTable | PullConsumer | TopicPublisher | XComStore
        ] = []

    # ------------------------------------------------------------------ configuration
    def get_config(self) -> ConnectionConfig:
        """The connection settings, read from the Airflow connection on every call.

        :raises ConfigurationError: the connection is missing (and is not the default one), or a
            field is invalid; the message names the connection id and the field.
        """
        try:
            conn = self.get_connection(self.pulsarstate_conn_id)
        except AirflowNotFoundException:
            conn = None
        return self._config_for(conn)

    async def aget_config(self) -> ConnectionConfig:
        """:meth:`get_config` for async code (triggers): the connection is read without blocking the
        event loop (``aget_connection``); the same defaults, checks and errors."""
        try:
            conn = await self.aget_connection(self.pulsarstate_conn_id)
        except AirflowNotFoundException:
            conn = None
        return self._config_for(conn)

    def _config_for(self, conn: Any) -> ConnectionConfig:
        """The config of a connection read by get_config/aget_config (None: not defined)."""
        conn_id = self.pulsarstate_conn_id
        if conn is None:
            if conn_id != self.default_conn_name:
                raise ConfigurationError(f"Airflow connection {conn_id!r} is not defined: {how_to_define(conn_id)}")
            if in_server_context():
                # A server process sees the deployment's connections; a missing one is a
                # mistake there, and the embedded file would be a different, empty store.
                raise ConfigurationError(
                    f"Airflow connection {conn_id!r} is not defined (looked up in the metadata DB, the secrets "
                    f"backends and the environment); server-side commands do not fall back to the embedded "
                    f"state log: {how_to_define(conn_id)}"
                )
            config = ConnectionConfig()
            refuse_multi_host_executor(conn_id)
            if not _default_logged.is_set():
                _default_logged.set()
                self.log.info(
                    "Airflow connection %r is not defined: using the embedded state log at %s",
                    conn_id,
                    config.embedded_path,
                )
            return config
        _mask_secrets(conn.password, conn.host, _extra_dict(conn.extra))
        config = config_from_connection(
            conn_id, conn_type=conn.conn_type, host=conn.host, password=conn.password, extra=conn.extra
        )
        _mask_secrets(config.auth_token, config.url, {"admin_url": config.admin_url})
        return config

    # ------------------------------------------------------------------ back end
    def get_conn(self) -> Backend:
        """The back end of the connection, opened on first call and kept until :meth:`close`.

        Opening does no network I/O; the broker or file is reached on first use.

        :raises ConfigurationError: see :meth:`get_config`.
        """
        return self._open()[1]

    def _open(self) -> tuple[ConnectionConfig, Backend]:
        with self._lock:
            if self._backend is None or self._config is None:
                config = self.get_config()
                self._backend = open_backend(config)
                self._config = config
            return self._config, self._backend

    def close(self) -> None:
        """Close the managers and maps this hook created, then the back end (idempotent)."""
        with self._lock:
            owned, self._owned = self._owned, []
            backend, self._backend, self._config = self._backend, None, None
        for obj in reversed(owned):
            try:
                obj.close()
            except Exception:
                self.log.warning("closing %r failed", obj, exc_info=True)
        if backend is not None:
            backend.close()

    def __enter__(self) -> PulsarStateHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ factories
    def topic_name(self, topic: str) -> str:
        """The fully qualified topic for ``topic`` (short names use the connection's tenant/namespace)."""
        return self._open()[0].topic_name(topic)

    def get_state_manager(self, topic: str, **options: Any) -> SharedStateManager[Any, Any]:
        """A :class:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager` on ``topic``.

        :param topic: a short name (resolved with the connection's tenant and namespace) or a full
            ``persistent://tenant/namespace/name``.
        :param options: keyword arguments of SharedStateManager (``initializer`` and ``applier`` are
            required); ``operation_timeout`` defaults to the connection's.
        :raises ConfigurationError: invalid connection or topic name.
        """
        config, backend = self._open()
        options.setdefault("operation_timeout", config.operation_timeout)
        return self._own(SharedStateManager(backend, config.topic_name(topic), **options))

    def get_map(self, topic: str, **options: Any) -> PulsarMap[Any, Any]:
        """A :class:`~airflow_provider_pulsarstate.engine.recipes.map.PulsarMap` on ``topic``.

        :param topic: a short name or a full ``persistent://tenant/namespace/name``.
        :param options: keyword arguments of PulsarMap (``key_serde``, ``value_serde``,
            ``max_value_bytes``, manager options); ``operation_timeout`` defaults to the connection's.
        :raises ConfigurationError: invalid connection or topic name.
        """
        config, backend = self._open()
        options.setdefault("operation_timeout", config.operation_timeout)
        return self._own(PulsarMap(backend, config.topic_name(topic), **options))

    def get_table(self, topic: str, **options: Any) -> StateTable:
        """A :class:`~airflow_provider_pulsarstate.engine.recipes.table.StateTable` (records with temp views) on ``topic``.

        :param topic: a short name or a full ``persistent://tenant/namespace/name``.
        :param options: manager options of StateTable. ``operation_timeout`` keeps the table's own
            default (applying a large view is one big record), not the connection's.
        :raises ConfigurationError: invalid connection or topic name.
        """
        config, backend = self._open()
        table = self._own(StateTable(backend, config.topic_name(topic), **options))
        report_topic(self, config, table.topic, direction="input")
        return table

    @contextlib.contextmanager
    def shared_table(self, topic: str) -> Iterator[StateTable]:
        """The process-wide :class:`~airflow_provider_pulsarstate.engine.recipes.table.StateTable`
        of ``topic`` for readers (the UI's API): opened and replayed on first use, then kept open
        for the next caller until idle or evicted, as :meth:`xcom_run_store`. Callers only read:
        an instance that never writes never takes the writer.

        :param topic: a short name or a full ``persistent://...`` (confined as :meth:`topic_name`).
        :raises ConfigurationError: invalid connection or topic name.
        """
        config = self.get_config()
        full_topic = config.topic_name(topic)
        key = ("table-reader", full_topic)
        with shared_objects.borrow(config, key, lambda backend: StateTable(backend, full_topic)) as table:
            yield table

    @contextlib.contextmanager
    def shared_leases(self, topic: str | None = None) -> Iterator[Leases]:
        """The process-wide :class:`~airflow_provider_pulsarstate.engine.recipes.lease.Leases` of the
        lease log ``topic`` for readers, kept open as :meth:`shared_table`."""
        config = self.get_config()
        full_topic = config.topic_name(topic or DEFAULT_LEASE_TOPIC)
        factory = lambda backend: Leases(backend, full_topic, operation_timeout=config.operation_timeout)  # noqa: E731
        with shared_objects.borrow(config, ("leases-reader", full_topic), factory) as leases:
            yield leases

    def list_topics(self, *, prefix: str = "") -> list[str]:
        """The topics of the connection's tenant/namespace whose short name starts with ``prefix``
        (full names, sorted; with their checkpoint and staging topics)."""
        config, backend = self._open()
        base = f"persistent://{config.tenant}/{config.namespace}/"
        return sorted(backend.list_topics(base + prefix))

    def read_last_entry_time(self, topic: str) -> float | None:
        """Publish time (Unix seconds) of ``topic``'s last entry (None: empty topic)."""
        config, backend = self._open()
        entry = backend.read_last(config.topic_name(topic), timeout=config.operation_timeout)
        return None if entry is None else entry.publish_time

    def get_xcom_store(self, topic: str, *, namespace: str, shared: bool = False, **options: Any) -> XComStore:
        """An :class:`~airflow_provider_pulsarstate.engine.recipes.xcom_store.XComStore` (XCom values
        keyed ``<namespace>/xcom/<dag>/<run>/<task>/<map_index>/<key>``) on ``topic``. Closed by :meth:`close`.

        :param topic: a short name or a full ``persistent://tenant/namespace/name``.
        :param namespace: the key namespace (``[pulsarstate] key_namespace``).
        :param shared: the process-wide store of this connection, topic, namespace and options
            (what the XCom backend uses: opening a store replays its log), closed at exit (or by
            :func:`close_shared_state_maps`), not by :meth:`close`; a changed connection takes
            effect after that.
        :param options: ``max_value_bytes`` and PulsarMap / manager options; ``operation_timeout``
            defaults to the connection's.
        :raises ConfigurationError: invalid connection or topic name.
        """
        if shared:
            config = self.cached_config()  # in a task process reading a connection is an API round trip
            full_topic = config.topic_name(topic)
            options.setdefault("operation_timeout", config.operation_timeout)
            key = ("xcom", full_topic, namespace, tuple(sorted(options.items())))
            return _shared(config, key, lambda backend: XComStore(backend, full_topic, namespace=namespace, **options))
        config, backend = self._open()
        options.setdefault("operation_timeout", config.operation_timeout)
        return self._own(XComStore(backend, config.topic_name(topic), namespace=namespace, **options))

    def cached_config(self) -> ConnectionConfig:
        """:meth:`get_config`, read once per process for this connection id (in a task process
        reading a connection is a round trip to the execution API); :func:`close_shared_state_maps`
        forgets it."""
        by_id = ("config", self.pulsarstate_conn_id)
        pid = os.getpid()
        with _shared_lock:
            held = _shared_by_conn_id.get(by_id)
        if held is not None and held[0] == pid:
            return held[1]
        config = self.get_config()
        with _shared_lock:
            _shared_by_conn_id[by_id] = (pid, config)
        return config

    def cached_topic_name(self, topic: str) -> str:
        """:meth:`topic_name` with the connection read once per process (:meth:`cached_config`)."""
        return self.cached_config().topic_name(topic)

    @contextlib.contextmanager
    def xcom_run_store(
        self, topic: str, *, namespace: str, dag_id: str, run_id: str, **options: Any
    ) -> Iterator[XComStore]:
        """The process-wide :class:`~airflow_provider_pulsarstate.engine.recipes.xcom_store.XComStore`
        of one DAG run (its own map, topic ``run_topic(topic, namespace, dag_id, run_id)``), opened on
        demand and kept open for the next caller until idle or evicted (at most
        ``shared_objects.DEFAULT_MAX_OPEN`` per process), never closed while in use.

        :param topic: the base XCom topic (``[pulsarstate] xcom_topic``): short or full name.
        :param options: ``max_value_bytes`` and PulsarMap / manager options.
        """
        config = self.cached_config()
        full_topic = run_topic(config.topic_name(topic), namespace, dag_id, run_id)
        options.setdefault("operation_timeout", config.operation_timeout)
        key = ("xcom-run", full_topic, namespace, tuple(sorted(options.items())))
        with shared_objects.borrow(
            config, key, lambda backend: XComStore(backend, full_topic, namespace=namespace, **options)
        ) as store:
            yield store

    @contextlib.contextmanager
    def xcom_message_log(
        self, topic: str, *, namespace: str, dag_id: str, run_id: str, **options: Any
    ) -> Iterator[XComMessageLog]:
        """The process-wide :class:`~airflow_provider_pulsarstate.engine.recipes.xcom_messages.XComMessageLog`
        of one DAG run (topic ``message_topic(topic, namespace, dag_id, run_id)``): one publisher
        and one reader per run and process, shared by its threads, opened on demand and kept for the
        next caller until idle or evicted (as :meth:`xcom_run_store`), never closed while in use.

        :param topic: the base XCom topic (``[pulsarstate] xcom_topic``): short or full name.
        :param options: ``max_value_bytes``; ``operation_timeout`` defaults to the connection's.
        """
        config = self.cached_config()
        full_topic = message_topic(config.topic_name(topic), namespace, dag_id, run_id)
        options.setdefault("operation_timeout", config.operation_timeout)
        key = ("xcom-messages", full_topic, namespace, tuple(sorted(options.items())))
        http = self._http_messages(config)
        with shared_objects.borrow(
            config,
            key,
            lambda backend: XComMessageLog(backend, full_topic, namespace=namespace, http=http, **options),
            lazy_backend=http is not None,
        ) as messages:
            yield messages

    @staticmethod
    def _http_messages(config: ConnectionConfig) -> PulsarHttpMessages | None:
        """This process's HTTP path to small messages of a Pulsar connection (None: embedded)."""
        if config.kind != "pulsar":
            return None
        return shared_objects.shared(
            config, ("pulsar-http",), lambda _opener: PulsarHttpMessages(config), lazy_backend=True
        )

    def get_leases(self, topic: str | None = None, **options: Any) -> Leases:
        """:class:`~airflow_provider_pulsarstate.engine.recipes.lease.Leases` (durable leases with
        fencing tokens) on the lease log ``topic``. Closed by :meth:`close`.

        :param topic: a short name or a full ``persistent://...`` (default: ``pulsarstate-leases``
            in the connection's tenant and namespace).
        :param options: keyword options of Leases; ``operation_timeout`` defaults to the connection's.
        :raises ConfigurationError: invalid connection or topic name.
        """
        config, backend = self._open()
        options.setdefault("operation_timeout", config.operation_timeout)
        return self._own(Leases(backend, config.topic_name(topic or DEFAULT_LEASE_TOPIC), **options))

    def reset_fence(self, topic: str, *, lease: str, lease_log: str | None = None) -> dict[tuple[str, str], int]:
        """Remove the fence of lease ``lease`` from the state log ``topic`` (a map's or a table's),
        with a record in the log (``airflow pulsarstate reset-fence``). For a fence raised by a
        token no lease log granted; until the next guarded write sets it again, older holders are
        not fenced.

        :param topic: a short name or a full ``persistent://...``.
        :param lease_log: the lease log whose fence goes (a short name, a full topic, or a
            ``topic#id`` key of ``fences``); None: the fences of that lease name of every lease log.
        :returns: the fences removed ((lease log, lease name) -> token).
        :raises TableNotFoundError: the log is empty.
        :raises ConfigurationError: a bad name or lease log (names the field).
        """
        config, backend = self._open()
        if lease_log is not None and "://" not in lease_log:
            lease_log = config.topic_name(lease_log)
        return reset_fence(
            backend, config.topic_name(topic), lease, lease_log=lease_log, operation_timeout=config.operation_timeout
        )

    @staticmethod
    def lease_from_json(handle: Any) -> Lease:
        """A :class:`~airflow_provider_pulsarstate.engine.recipes.lease.Lease` from its XCom form
        (``Lease.to_json()``: a dict or its JSON text), checked field by field (not yet against the
        lease log: ``get_leases(lease.topic).renew(lease)`` does that).

        :raises ConfigurationError: not a lease handle (names the missing or bad field).
        """
        return Lease.from_json(handle)

    def get_pull_consumer(self, topic: str, subscription: str | None = None, **options: Any) -> PullConsumer:
        """A :class:`~airflow_provider_pulsarstate.engine.offsets.consumer.PullConsumer` on ``topic``:
        Kafka-style pulls by offset, commits on the durable ``subscription``. Closed by :meth:`close`.

        :param topic: a short name (the connection's tenant/namespace) or a full ``persistent://...``.
        :param subscription: the durable subscription for ``commit``/``committed``/``lag`` (None: pull only).
        :param options: keyword options of PullConsumer (``auto_offset_reset``, ``reader_pool_size``,
            ``reader_idle_timeout``, ``position_cache_size``).
        :raises ConfigurationError: invalid connection, topic name or option.
        """
        config, backend = self._open()
        name = config.topic_name(topic)
        report_topic(self, config, name, direction="input")
        return self._own(PullConsumer(backend, name, subscription, **options))

    def get_publisher(self, topic: str, *, batching: bool = True) -> TopicPublisher:
        """A :class:`~airflow_provider_pulsarstate.engine.offsets.base.TopicPublisher` of plain
        messages to ``topic`` (not for state logs). Closed (flushed) by :meth:`close`.

        :param batching: Pulsar batches messages into entries (the embedded log ignores it).
        """
        config, backend = self._open()
        name = config.topic_name(topic)
        report_topic(self, config, name, direction="output")
        return self._own(open_publisher(backend, name, batching=batching))

    def create_topic(self, topic: str, *, partitions: int = 0) -> str:
        """Create ``topic`` (``partitions`` > 0: partitioned); an identical existing topic is fine.

        :return: the full topic name.
        :raises ConfigurationError: invalid name, or it exists with another partition count.
        """
        config, backend = self._open()
        name = config.topic_name(topic)
        _create_topic(backend, name, partitions=partitions)
        return name

    def get_async_offset_probe(
        self, *, config: ConnectionConfig | None = None, freshness: float = 0.0
    ) -> AsyncOffsetProbe:
        """An :class:`~airflow_provider_pulsarstate.engine.offsets.base.AsyncOffsetProbe` for this
        connection: end and committed offsets read without blocking an event loop (no I/O here).

        :param config: the connection as read by ``await hook.aget_config()`` (inside a running
            event loop, e.g. a trigger); default: :meth:`get_config`, which reads it synchronously.

        :param freshness: seconds an answer may have been sent before a request it serves: the
            probes of one loop share equal admin requests (Pulsar; 0: each answer sent after the request).

        The caller owns the probe and closes it with ``await probe.aclose()``; topics passed to it
        are full names (``config.topic_name(short)``).
        """
        return open_async_probe(config if config is not None else self.get_config(), freshness=freshness)

    # topic messages (PulsarMessageTrigger) -----------------------------------------------------
    def get_async_topic_stream(
        self,
        topics: str | list[str] | tuple[str, ...],
        subscription: str,
        *,
        config: ConnectionConfig | None = None,
        dead_letter_topic: str | None = None,
        **options: Any,
    ) -> TopicStream:
        """A :class:`~airflow_provider_pulsarstate.engine.topic_stream.TopicStream`: messages of
        ``topics`` on the durable ``subscription``, received and settled without blocking an event
        loop (no I/O here: ``await stream.open()`` or ``async with``). The caller closes it.

        :param topics: a name or a list; short names use the connection's tenant/namespace.
        :param config: as :meth:`get_async_offset_probe` (pass ``await hook.aget_config()`` in a loop).
        :param dead_letter_topic: a short or full name (see TopicStreamOptions).
        :param options: ``initial_position``, ``receiver_queue_size``, ``redelivery_delay``,
            ``max_redeliveries``, ``consumer_name``.
        :raises ConfigurationError: the connection is embedded (named), or a topic name or option is invalid.
        """
        config = config if config is not None else self.get_config()
        names = [topics] if isinstance(topics, str) else list(topics)
        if config.kind != "pulsar":
            return open_topic_stream(config, topics=names, subscription=subscription, conn_id=self.pulsarstate_conn_id)
        return open_topic_stream(
            config,
            topics=[config.topic_name(t) for t in names],
            subscription=subscription,
            conn_id=self.pulsarstate_conn_id,
            dead_letter_topic=config.topic_name(dead_letter_topic) if dead_letter_topic else None,
            **options,
        )

    def read_message(self, reference: Mapping[str, Any], *, timeout: float | None = None) -> TopicMessage:
        """The message an event entry of ``PulsarMessageTrigger`` refers to (its payload was too
        large to carry: ``payload_encoding == "reference"``); ``.payload`` holds the bytes and
        ``.decode_payload("json")`` parses them. Readable while the namespace's retention keeps it.

        :param reference: the entry (or any mapping with its ``topic`` and base64 ``message_id``).
        :param timeout: seconds to wait for the message (None: the connection's operation time-out).
        :raises ConfigurationError: ``reference`` lacks ``topic`` or a base64 ``message_id``, or the
            connection is embedded (no Pulsar messages to read).
        :raises MessageUnavailableError: the message is gone (trimmed by retention) or did not come in time.
        """
        topic, message_id = reference.get("topic"), reference.get("message_id")
        if not isinstance(topic, str) or not topic.startswith("persistent://"):
            raise ConfigurationError(f"read_message: reference has no full topic name, got {topic!r}")
        try:
            raw_id = base64.b64decode(message_id, validate=True) if isinstance(message_id, str) else b""
        except ValueError:
            raw_id = b""
        if not raw_id:
            raise ConfigurationError(f"read_message: reference has no base64 message_id, got {message_id!r}")
        config, backend = self._open()
        if config.kind != "pulsar":
            raise ConfigurationError(
                f"read_message: connection {self.pulsarstate_conn_id!r} is embedded; referenced messages live on Pulsar"
            )
        wait = config.operation_timeout if timeout is None else timeout
        return read_topic_message(backend.client, topic, raw_id, timeout=wait)

    def get_leadership(self, topic: str) -> list[Leadership]:
        """Who holds ``topic``'s exclusive writer now, per partition (read-only; see
        :mod:`~airflow_provider_pulsarstate.engine.leadership`).

        :param topic: a short name or a full ``persistent://...``.
        :return: one :class:`~airflow_provider_pulsarstate.engine.leadership.Leadership` per
            partition (one, partition None, for a non-partitioned topic).
        :raises LeadershipError: the topic does not exist (named).
        :raises BackendUnavailableError: the broker's admin API or the embedded file cannot be reached.
        """
        config, backend = self._open()
        return read_leadership(backend, config.topic_name(topic))

    def get_async_leadership_probe(
        self, *, config: ConnectionConfig | None = None, freshness: float = 0.0
    ) -> AsyncLeadershipProbe:
        """An :class:`~airflow_provider_pulsarstate.engine.leadership.AsyncLeadershipProbe`:
        :meth:`get_leadership` without blocking an event loop (no I/O here). As
        :meth:`get_async_offset_probe`: pass the config read by ``await hook.aget_config()``
        inside a loop; the caller closes the probe (``await probe.aclose()``); topics are full names;
        ``freshness`` as there."""
        return open_async_leadership_probe(config if config is not None else self.get_config(), freshness=freshness)

    def get_async_lease_observer(
        self, topic: str | None = None, *, config: ConnectionConfig | None = None, freshness: float = 0.0
    ) -> AsyncLeaseObserver:
        """An :class:`~airflow_provider_pulsarstate.engine.leadership.AsyncLeaseObserver` on the
        lease log ``topic`` (default: :meth:`get_leases`'s): ``await observer.describe(name)``
        without acquiring and without blocking an event loop. No I/O here; the caller closes it
        (``await observer.aclose()``). ``freshness``: seconds a read of the log shared with the
        loop's other observers may have started before a describe."""
        config = config if config is not None else self.get_config()
        return AsyncLeaseObserver(config, config.topic_name(topic or DEFAULT_LEASE_TOPIC), freshness=freshness)

    # ------------------------------------------------------------------ table feeds (StateChangeTrigger)
    def get_table_feed(self, topic: str, *, after: int | None = None, key_prefix: str | None = None) -> TableFeed:
        """A :class:`~airflow_provider_pulsarstate.engine.recipes.table_feed.TableFeed`: the commits
        of table ``topic`` after commit offset ``after`` (None: from the tail on), in counts. Closed
        by :meth:`close`.

        :param topic: a short name or a full ``persistent://...``.
        :param key_prefix: also count the rows set and deleted under this prefix.
        """
        config, backend = self._open()
        return self._own(
            TableFeed(
                backend,
                config.topic_name(topic),
                after=after,
                key_prefix=key_prefix,
                operation_timeout=config.operation_timeout,
            )
        )

    def get_async_table_feed(
        self,
        topic: str,
        *,
        after: int | None,
        key_prefix: str | None = None,
        freshness: float = 0.0,
        config: ConnectionConfig | None = None,
    ) -> AsyncTableFeed:
        """:meth:`get_table_feed` for a trigger: never blocking an event loop, and through one
        reader of the table shared by every feed of the process (each with its own watermark; see
        :mod:`~airflow_provider_pulsarstate.engine.recipes.shared_table_feed`). No I/O here. Pass
        the config read by ``await hook.aget_config()`` inside a loop; the caller closes the feed
        (``await feed.aclose()``).

        :param freshness: seconds a poll may be answered from a shared read started before it.
        """
        config = config if config is not None else self.get_config()
        return AsyncTableFeed(config, config.topic_name(topic), after=after, key_prefix=key_prefix, freshness=freshness)

    def get_table_changes(
        self,
        topic: str,
        offset: int,
        *,
        key_prefix: str | None = None,
        timeout: float | None = None,
    ) -> CommitChanges:
        """The row changes of table ``topic``'s commit at ``offset`` (e.g. an asset event's
        ``extra["offset"]`` from ``StateChangeTrigger``), under the table's acceptance rules.

        :param key_prefix: keep only changes to keys under this prefix.
        :raises TableNotFoundError: the table's log is empty.
        :raises CommitNotFoundError: ``offset`` is not a commit of the table (named, with its last commit).
        """
        config, backend = self._open()
        return read_commit(
            backend,
            config.topic_name(topic),
            offset,
            key_prefix=key_prefix,
            operation_timeout=config.operation_timeout,
            timeout=timeout,
        )

    # ------------------------------------------------------------------ end of table feeds

    # ------------------------------------------------------------------ task and asset state
    def get_state_store(self, *, topic: str | None = None, namespace: str | None = None) -> StateStore:
        """The task/asset :class:`~airflow_provider_pulsarstate.engine.recipes.state_store.StateStore`
        the state-store backend uses (``[pulsarstate] state_store_topic`` and ``key_namespace`` by
        default): one map per DAG run (task state) and one per asset.

        The maps come from the process-wide pool (:mod:`~airflow_provider_pulsarstate.hooks.shared_objects`):
        opened when a scope is first touched (opening a map replays its log, which holds one run's or
        one asset's state), shared by every hook of the process, closed when idle or evicted, never
        while in use. The connection is read once per process (:meth:`cached_config`).
        """
        settings = _settings()
        config = self.cached_config()
        base = config.topic_name(topic or settings.state_store_topic)
        maps = _PooledStateMaps(
            config,
            {
                "max_value_bytes": settings.state_store_max_value_bytes,
                "operation_timeout": config.operation_timeout,
                "writer_idle_timeout": settings.state_store_writer_idle_timeout,
            },
        )
        return StateStore(maps, base, namespace=namespace or settings.key_namespace)

    def get_state(self, scope: Any, key: str, default: Any = None, **store: Any) -> Any:
        """The current value of ``key`` in ``scope`` (see :meth:`update_state`), read at the tail
        of the log, or ``default`` when absent or expired."""
        return self.get_state_store(**store).get(state_scope(scope), key, default)

    def update_state(self, scope: Any, key: str, fn: Any, *, expires_at: Any = KEEP, **store: Any) -> Any:
        """Atomically replace a state value with ``fn(current)`` and return the new value.

        Airflow's state-store API has only get/set, and its own example
        (``set(key, get(key) + 1)``) loses increments when tasks run at once. This does not:
        ``fn`` (free of side effects: it may run more than once) gets the decoded current value
        (None when absent or expired) and runs under the map's single writer on the latest state;
        returning None deletes the key. ``context["task_state_store"].get`` /
        ``context["asset_state_store"].get`` see the result when PulsarStateStoreBackend is the
        configured backend::

            PulsarStateHook().update_state(AssetScope(name="prices"), "runs", lambda n: (n or 0) + 1)
            PulsarStateHook().update_state(TaskScope(dag_id, run_id, task_id, map_index), "tries", ...)

        :param scope: Airflow's ``TaskScope`` / ``AssetScope`` (by ``name``; ``ti`` fields or a
            context's ``ti`` also work), or the engine's ``TaskStateScope`` / ``AssetStateScope``.
        :param expires_at: KEEP (the entry's expiry), None (never) or an aware datetime.
        :param store: ``topic`` / ``namespace`` of :meth:`get_state_store`.
        """
        return self.get_state_store(**store).update(state_scope(scope), key, fn, expires_at=expires_at)

    def compare_and_set_state(
        self, scope: Any, key: str, expected: Any, new: Any, *, expires_at: Any = None, **store: Any
    ) -> bool:
        """Set a state value to ``new`` (None: delete) only when it equals ``expected`` (None:
        absent), atomically; returns whether it was set. ``scope`` as :meth:`update_state`."""
        return self.get_state_store(**store).compare_and_set(
            state_scope(scope), key, expected, new, expires_at=expires_at
        )

    def _own(self, obj: Any) -> Any:
        with self._lock:
            self._owned.append(obj)
        return obj

    # ------------------------------------------------------------------ UI
    def test_connection(self) -> tuple[bool, str]:
        """One cheap round trip with exactly the config real use builds; never raises.

        Least privilege, no side effect: nothing is created on the broker or on disk.

        Pulsar: the admin API lists the topics of the connection's namespace (allowed to any role
        that may produce or consume there; no super-user needed), then the binary protocol asks
        for the partition metadata of one of them, or of ``__pulsarstate_healthcheck`` in an
        empty namespace (a metadata lookup creates no topic). Embedded: the state file, when it
        exists, is opened read-only and read; one that does not exist yet is green when the first
        write can create it (:func:`~.embedded_check.check_embedded_file`); nothing is created.

        :return: ``(True, what was reached)`` or ``(False, what failed and why)``.
        """
        try:
            config = self.get_config()
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        if config.kind == "embedded":
            return check_embedded_file(config)
        target = (
            f"connection {self.pulsarstate_conn_id!r}: Pulsar broker {redact_url(config.url)} "
            f"(admin {redact_url(config.resolved_admin_url)})"
        )
        backend: Backend | None = None
        field = "admin_url"  # the one the failing step reaches
        try:
            from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend

            backend = open_backend(config)
            assert isinstance(backend, PulsarBackend)
            topics = backend.admin.namespace_topics(config.tenant, config.namespace)
            persistent = sorted(t for t in topics if t.startswith("persistent://"))
            probe = (
                persistent[0] if persistent else f"persistent://{config.tenant}/{config.namespace}/{HEALTHCHECK_TOPIC}"
            )
            field = "service_url"
            backend.client.get_topic_partitions(probe)
        except Exception as exc:
            named = "" if f"field {field!r}" in str(exc) else f" (field {field!r})"
            return False, f"{target}{named}: {type(exc).__name__}: {exc}"
        finally:
            if backend is not None:
                try:
                    backend.close()
                except Exception:
                    log.debug("closing the back end after test_connection failed", exc_info=True)
        return True, f"Connected to {target}, namespace {config.tenant}/{config.namespace} ({len(topics)} topics)"


class _PooledStateMaps:
    """The state store's :class:`~airflow_provider_pulsarstate.engine.recipes.state_store.MapSource`:
    maps borrowed from this process's pool, one per topic."""

    def __init__(self, config: ConnectionConfig, options: dict[str, Any]) -> None:
        self._config = config
        self._options = options

    @property
    def backend(self) -> Backend:
        return shared_objects.backend_for(self._config)

    @contextlib.contextmanager
    def borrow(self, topic: str) -> Iterator[PulsarMap[str, Any]]:
        key = ("state-map", topic, tuple(sorted(self._options.items())))
        with shared_objects.borrow(
            self._config, key, lambda backend: PulsarMap(backend, topic, **self._options)
        ) as table:
            yield table

    def list_topics(self, prefix: str) -> list[str]:
        return self.backend.list_topics(prefix)


def state_scope(scope: Any) -> StateScope:
    """The engine scope of Airflow's ``TaskScope`` / ``AssetScope`` (worker or server flavour, or
    anything with their fields, e.g. a ``ti``), or an engine scope as is.

    :raises ValueError: an asset scope without a ``name`` (a server-side ``asset_id`` is resolved
        by the state-store backend, which has the DB session; a ``uri`` alone cannot be keyed by name).
    """
    if isinstance(scope, (TaskStateScope, AssetStateScope)):
        return scope
    if all(hasattr(scope, f) for f in ("dag_id", "run_id", "task_id")):
        map_index = getattr(scope, "map_index", -1)
        return TaskStateScope(scope.dag_id, scope.run_id, scope.task_id, -1 if map_index is None else int(map_index))
    name = getattr(scope, "name", None)
    if isinstance(name, str) and name:
        return AssetStateScope(name)
    raise ValueError(
        f"cannot key state by {scope!r}: a task scope needs dag_id, run_id, task_id (and map_index); "
        "an asset scope needs the asset's name (use Asset/AssetNameRef, not AssetUriRef)"
    )


def _settings() -> Any:
    """``[pulsarstate]``, read once per process; :func:`close_shared_state_maps` forgets it."""
    from airflow_provider_pulsarstate.provider_settings import settings

    return settings()


_shared_lock = threading.Lock()
_shared_by_conn_id: dict[tuple[Any, ...], tuple[int, Any]] = {}  # shared objects, found without reading the connection


def _shared(config: ConnectionConfig, key: tuple[Any, ...], factory: Callable[[Backend], Any]) -> Any:
    """The process-wide pinned object ``factory(backend)`` made for (connection, ``key``)
    (see :mod:`~airflow_provider_pulsarstate.hooks.shared_objects`)."""
    return shared_objects.shared(config, key, factory)


@atexit.register
def close_shared_state_maps() -> None:
    """Close this process's shared state maps and their back ends (also run at exit)."""
    with _shared_lock:
        _shared_by_conn_id.clear()
    from airflow_provider_pulsarstate.provider_settings import forget_settings

    forget_settings()
    shared_objects.close_all()


def _extra_dict(extra: str | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(extra, dict):
        return extra
    try:
        data = json.loads(extra) if extra else {}
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mask_secrets(token: str | None, url: str | None, extra: dict[str, Any]) -> None:
    """Register the token and any URL credentials with Airflow's log masker (before parsing can fail)."""
    from airflow.sdk.log import mask_secret

    secrets = [token] if token else []
    for key, value in extra.items():
        if not isinstance(value, str):
            continue
        if key.endswith("auth_token"):
            secrets.append(value)
        secrets.extend(url_secrets(value))
    secrets.extend(url_secrets(url or ""))
    for secret in secrets:
        if secret and secret.strip():
            mask_secret(secret.strip())


def how_to_define(conn_id: str) -> str:
    """How to define the connection ``conn_id`` (for error messages)."""
    return (
        f"define it with `airflow connections add {conn_id} --conn-type {CONN_TYPE} --conn-extra "
        f'\'{{"service_url": "pulsar://broker:6650"}}\'` (an empty extra selects the embedded state log '
        f"under $AIRFLOW_HOME/pulsarstate/state.db), or set AIRFLOW_CONN_{conn_id.upper()}"
    )


LOCAL_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})
"""Executors that run every task on the scheduler's host (where the embedded default is shared)."""


def refuse_multi_host_executor(conn_id: str) -> None:
    """Raise ConfigurationError when ``[core] executor`` may run tasks on other hosts.

    ``[core] executor`` may list several executors (Airflow 3), each ``alias:module.Class`` or a name.
    """
    from airflow.configuration import conf

    configured = conf.get("core", "executor", fallback="LocalExecutor") or "LocalExecutor"
    remote = [
        name.strip()
        for name in configured.split(",")
        if name.strip() and name.strip().rpartition(":")[2].rpartition(".")[2] not in LOCAL_EXECUTORS
    ]
    if remote:
        raise ConfigurationError(
            f"Airflow connection {conn_id!r} is not defined, and the embedded default state log cannot be shared "
            f"by executor(s) {', '.join(remote)} that run tasks on several hosts (each host would get its own private "
            f"file, and a view applied from one would delete what the others staged). Configure a pulsarstate "
            f"connection: create {conn_id!r} (type {CONN_TYPE!r}) or set AIRFLOW_CONN_{conn_id.upper()}"
        )


def config_from_connection(
    conn_id: str,
    *,
    conn_type: str | None = None,
    host: str | None = None,
    password: str | None = None,
    extra: str | dict[str, Any] | None = None,
) -> ConnectionConfig:
    """Build the config from the parts of an Airflow connection.

    :param conn_id: named in every error message.
    :param conn_type: only checked for a warning (a connection of another type is still read).
    :param host: stands in for ``service_url`` when it is a URL or a path.
    :param password: stands in for ``auth_token``.
    :param extra: the extra, as the JSON text Airflow stores or as a dict.
    :raises ConfigurationError: the extra is not a JSON object, has an unknown key, or a value is
        invalid; the message names ``conn_id`` and the field.
    """

    def fail(field: str, problem: str) -> ConfigurationError:
        return ConfigurationError(f"connection {conn_id!r}, field {field!r}: {problem}")

    if conn_type and conn_type != CONN_TYPE:
        log.warning("connection %r has type %r, reading it as %r", conn_id, conn_type, CONN_TYPE)

    fields = _parse_extra(conn_id, extra, fail)
    values: dict[str, Any] = {}
    for name in _STRING_FIELDS:
        raw = fields.get(name)
        if raw is None:
            continue
        if not isinstance(raw, str):
            raise fail(name, f"must be a string, got {type(raw).__name__} {raw!r}")
        if raw.strip():
            values[name] = raw.strip()

    url_field = "service_url"
    if "service_url" not in values and host and host.strip():
        candidate = host.strip()
        if "://" not in candidate and not candidate.startswith(("/", "~", ".")):
            raise fail(
                "host",
                f"{candidate!r} is neither a URL nor a path; set service_url to e.g. pulsar://{candidate}:6650",
            )
        values["service_url"], url_field = candidate, "host"
    if "auth_token" not in values and password:
        values["auth_token"] = password

    for name in _BOOL_FIELDS:
        raw = fields.get(name)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            continue
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            raw = raw.strip().lower() == "true"
        if not isinstance(raw, bool):
            raise fail(name, f"must be true or false, got {raw!r}")
        values[name] = raw

    timeout = fields.get("operation_timeout")
    if timeout is not None and not (isinstance(timeout, str) and not timeout.strip()):
        values["operation_timeout"] = _parse_seconds(timeout, lambda problem: fail("operation_timeout", problem))

    config_args: dict[str, Any] = {("url" if k == "service_url" else k): v for k, v in values.items()}
    try:
        ConnectionConfig(url=config_args.get("url", ""))  # the URL scheme, on its own
    except ConfigurationError as exc:
        raise fail(url_field, str(exc)) from None
    try:
        return ConnectionConfig(**config_args, source=f"connection {conn_id!r}")
    except ConfigurationError as exc:  # the URLs together (token over plain http, file URL host)
        raise ConfigurationError(f"connection {conn_id!r}: {exc}") from None


def _parse_extra(conn_id: str, extra: str | dict[str, Any] | None, fail: Any) -> dict[str, Any]:
    if extra is None or extra == "":
        return {}
    if isinstance(extra, str):
        try:
            data = json.loads(extra)
        except json.JSONDecodeError as exc:
            raise fail("extra", f"is not valid JSON ({exc})") from None
    else:
        data = extra
    if not isinstance(data, dict):
        raise fail("extra", f"must be a JSON object, got {type(data).__name__}")
    fields: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # field -> the key it was read from
    for key, value in data.items():
        name = key[len(LEGACY_EXTRA_PREFIX) :] if key.startswith(LEGACY_EXTRA_PREFIX) else key
        if name in RENAMED_FIELDS:
            warnings.warn(
                f"connection {conn_id!r}: extra field {key!r} is deprecated, rename it to {RENAMED_FIELDS[name]!r} "
                "(Airflow masks fields named like secrets, so the connection form shows and saves it as '***')",
                DeprecationWarning,
                stacklevel=4,
            )
            name = RENAMED_FIELDS[name]
        if name not in FIELD_NAMES:
            raise fail(key, f"unknown extra field; expected one of {', '.join(sorted(FIELD_NAMES))}")
        if name in fields and _precedence(key) <= _precedence(spelled[name]):
            continue  # the current, unprefixed spelling wins
        fields[name], spelled[name] = value, key
    return fields


def _precedence(key: str) -> int:
    """Which spelling of a field wins: current name > renamed one > legacy-prefixed ones."""
    name = key[len(LEGACY_EXTRA_PREFIX) :] if key.startswith(LEGACY_EXTRA_PREFIX) else key
    return (0 if key.startswith(LEGACY_EXTRA_PREFIX) else 2) + (0 if name in RENAMED_FIELDS else 1)


def _parse_seconds(raw: Any, fail: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise fail(f"must be a number of seconds, got {type(raw).__name__} {raw!r}")
    try:
        seconds = float(raw)
    except ValueError:
        raise fail(f"must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise fail(f"must be a positive number of seconds, got {raw!r}")
    return seconds
