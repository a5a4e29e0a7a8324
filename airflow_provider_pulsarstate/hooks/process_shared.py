"""The hook's process-wide objects: opened once per process and shared by every hook in it.

What the XCom backend, the state-store backend and the UI's API read through: the connection read
once per process, the tables, lease logs and per-run XCom stores borrowed from the pool of
:mod:`~airflow_provider_pulsarstate.hooks.shared_objects`, and the HTTP path to small messages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.backends import backend_offers
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PulsarHttpMessages
from airflow_provider_pulsarstate.engine.recipes.lease import DEFAULT_LEASE_TOPIC, Leases
from airflow_provider_pulsarstate.engine.recipes.table import StateTable
from airflow_provider_pulsarstate.engine.recipes.xcom_messages import XComMessageLog, message_topic
from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComStore, run_topic
from airflow_provider_pulsarstate.hooks import shared_objects


class SharedObjectMethods:
    """The process-wide objects of :class:`~airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook`."""

    if TYPE_CHECKING:
        pulsarstate_conn_id: str

        def get_config(self) -> ConnectionConfig: ...

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

    def cached_config(self) -> ConnectionConfig:
        """:meth:`get_config`, read once per process for this connection id (in a task process
        reading a connection is a round trip to the execution API); :func:`close_shared_state_maps`
        forgets it."""
        return shared_objects.cached_config(self.pulsarstate_conn_id, self.get_config)

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
        """This process's HTTP path to small messages of the connection's broker (None: a store
        without message ids)."""
        if not config.has_subscriptions:  # a store without message ids has no such path
            return None
        return shared_objects.shared(
            config,
            ("pulsar-http",),
            lambda _opener: backend_offers(config).open_http_messages(config),
            lazy_backend=True,
        )
