"""PulsarStateHook: the one place that turns an Airflow connection into a state back end.

Everything else in the Airflow layer (operators, sensors, triggers, the XCom backend) asks this
hook for its :class:`~airflow_provider_pulsarstate.engine.config.ConnectionConfig`, back end, state
managers and maps, so a connection means the same thing everywhere, including the UI's Test button.

The hook's parts live beside it, one job each: reading a connection (:mod:`.connection_config`),
where the embedded default may serve (:mod:`.executor_policy`), the process-wide objects
(:mod:`.process_shared` over :mod:`.shared_objects`), task and asset state (:mod:`.state_store_access`),
topics and messages (:mod:`.topic_access`) and the async probes triggers poll (:mod:`.async_probes`).
This module re-exports what callers import from it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_pulsarstate.engine.backends import Backend, backend_offers, open_backend
from airflow_provider_pulsarstate.engine.backends.pulsar_offers import HEALTHCHECK_TOPIC
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.leadership import (
    Leadership,
    read_leadership,
)
from airflow_provider_pulsarstate.engine.manager import SharedStateManager
from airflow_provider_pulsarstate.engine.offsets import (
    PullConsumer,
    TopicPublisher,
    delete_topic_if_unchanged,
)
from airflow_provider_pulsarstate.engine.recipes.fence_admin import reset_fence
from airflow_provider_pulsarstate.engine.recipes.lease import DEFAULT_LEASE_TOPIC, Lease, LeaseKeeper, Leases
from airflow_provider_pulsarstate.engine.recipes.map import PulsarMap
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
)
from airflow_provider_pulsarstate.engine.turns import STARTS_PER_TURN, take_turn
from airflow_provider_pulsarstate.hooks import shared_objects
from airflow_provider_pulsarstate.hooks.airflow_internals import in_server_context
from airflow_provider_pulsarstate.hooks.async_probes import AsyncHookMethods
from airflow_provider_pulsarstate.hooks.connection_config import (
    config_from_connection,
    extra_dict,
    how_to_define,
    mask_secrets,
)
from airflow_provider_pulsarstate.hooks.connection_form import CONN_TYPE, HOOK_NAME
from airflow_provider_pulsarstate.hooks.executor_policy import refuse_multi_host_executor
from airflow_provider_pulsarstate.hooks.process_shared import SharedObjectMethods
from airflow_provider_pulsarstate.hooks.shared_objects import close_shared_state_maps
from airflow_provider_pulsarstate.hooks.state_store_access import StateStoreMethods, state_scope
from airflow_provider_pulsarstate.hooks.topic_access import TopicMethods
from airflow_provider_pulsarstate.lineage.hook import report_topic

log = logging.getLogger(__name__)


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

_default_logged = threading.Event()


class PulsarStateHook(TopicMethods, SharedObjectMethods, AsyncHookMethods, StateStoreMethods, BaseHook):
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
        mask_secrets(conn.password, conn.host, extra_dict(conn.extra))
        config = config_from_connection(
            conn_id, conn_type=conn.conn_type, host=conn.host, password=conn.password, extra=conn.extra
        )
        mask_secrets(config.auth_token, config.url, {"admin_url": config.admin_url})
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
            factory = lambda backend: XComStore(backend, full_topic, namespace=namespace, **options)  # noqa: E731
            return shared_objects.shared(config, key, factory)
        config, backend = self._open()
        options.setdefault("operation_timeout", config.operation_timeout)
        return self._own(XComStore(backend, config.topic_name(topic), namespace=namespace, **options))

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
        write can create it (:func:`~airflow_provider_pulsarstate.engine.backends.embedded_check.check_embedded_file`); nothing is created.

        :return: ``(True, what was reached)`` or ``(False, what failed and why)``.
        """
        try:
            config = self.get_config()
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return backend_offers(config).check_reachable(config)
