"""Which fencing tokens a lease log granted, as one state manager checks them before a guarded write.

A lease log grants the tokens of a name one by one (1, 2, 3, ...), so it granted token ``t`` of a
name exactly when its last token for that name is at least ``t``; once granted, always granted.
:class:`LeaseGrants` keeps a read-only replica of each lease log it was asked about and answers
from it without I/O when the replica already shows the token; otherwise it reads the lease log
up to its tail first. A replica that may be of an earlier incarnation of its lease log (deleted
and recreated under the same topic) is replaced when the caller asks for a fresh answer.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, LeaseNotGrantedError
from airflow_provider_pulsarstate.engine.fencing import lease_log_ref

if TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.recipes.lease import Leases


class LeaseGrants:
    """Checks tokens against the lease logs that granted them (one replica per lease log).

    Construction does no I/O. Thread-safe; checks are serialized.

    :param backend: where the lease logs live (the state log's back end).
    :param topic: the state log asking (for error messages; never itself a lease log).
    :param operation_timeout: seconds one read of a lease log may take.
    """

    def __init__(self, backend: Backend, topic: str, *, operation_timeout: float = 30.0) -> None:
        self.backend = backend
        self.topic = topic
        self.operation_timeout = operation_timeout
        self._replicas: dict[str, Leases] = {}
        self._lock = threading.Lock()

    def verify(self, lease_log: str, name: str, token: int, *, fresh: bool = False) -> str:
        """The lease log's reference for fences (:func:`~airflow_provider_pulsarstate.engine.fencing.lease_log_ref`)
        when ``lease_log`` granted ``token`` of ``name``.

        :param fresh: replace the replica of ``lease_log`` by a new one first (the lease log may
            have been recreated since it was opened).
        :raises LeaseNotGrantedError: the lease log never granted that token (an empty or missing
            lease log granted none).
        :raises ConfigurationError: ``lease_log`` is the state log itself.
        """
        if lease_log == self.topic:
            raise ConfigurationError(
                f"lease {name!r}: {lease_log} cannot be both the lease log and the state log it guards"
            )
        with self._lock:
            leases = self._replica(lease_log, fresh=fresh)
            granted = _last_token(leases, name, latest=False)
            if granted < token:
                granted = _last_token(leases, name, latest=True)
            if granted < token:
                raise LeaseNotGrantedError(
                    topic=self.topic, lease=name, token=token, lease_log=lease_log, granted=granted
                )
            return lease_log_ref(lease_log, leases.manager.log_id)

    def close(self) -> None:
        with self._lock:
            replicas, self._replicas = list(self._replicas.values()), {}
        for leases in replicas:
            leases.close()

    def _replica(self, lease_log: str, *, fresh: bool) -> Leases:
        from airflow_provider_pulsarstate.engine.recipes.lease import Leases  # the recipe is built on the manager

        leases = self._replicas.get(lease_log)
        if leases is not None and fresh:
            leases.close()
            leases = None
        if leases is None:
            leases = self._replicas[lease_log] = Leases(
                self.backend, lease_log, operation_timeout=self.operation_timeout
            )
        return leases


def _last_token(leases: Any, name: str, *, latest: bool) -> int:
    info = leases.describe(name, latest=latest)
    return 0 if info is None else int(info.token)
