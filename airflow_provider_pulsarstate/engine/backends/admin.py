"""A small client for the Pulsar admin REST API (the endpoints this project needs).

No maintained Python admin library exists (see REFERENCE §3); ``requests`` is enough. Every call
is bounded by the connection's operation time-out and raises our own errors.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow_provider_pulsarstate.engine.config import redact_url
from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, ConfigurationError

if TYPE_CHECKING:
    import requests


def admin_unreachable(
    exc: Exception, method: str, path: str, *, url: str, shown_url: str, origin: str = ""
) -> BackendUnavailableError:
    """The error for an admin request that got no answer (credentials in ``url`` never shown);
    ``origin`` (e.g. `` (connection 'x', field 'admin_url')``) follows the URL."""
    detail = str(exc).replace(url, shown_url)
    return BackendUnavailableError(
        f"Pulsar admin API {shown_url}{origin} unreachable ({method} {shown_url}/admin/v2/{path}): "
        f"{type(exc).__name__}: {detail}"
    )


def check_admin_status(method: str, path: str, status: int, text: str, *, ok: tuple[int, ...], shown_url: str) -> None:
    """Raise BackendUnavailableError naming the request and the answer when ``status`` is not in ``ok``."""
    if status not in ok:
        raise BackendUnavailableError(
            f"Pulsar admin API {method} {shown_url}/admin/v2/{path} answered {status}: {text[:300]}"
        )


class PulsarAdmin:
    """Admin REST calls for topics of one broker.

    :param url: the admin base URL, e.g. ``http://127.0.0.1:8080``.
    :param auth_token: sent as a Bearer token when given.
    :param tls_trust_certs_file_path: CA bundle for https, passed with every request (so
        ``$REQUESTS_CA_BUNDLE`` / ``$CURL_CA_BUNDLE`` cannot replace it); without it the system
        CAs (or those variables) apply.
    :param timeout: seconds per request.
    :param origin: where the URL comes from, shown after it when it is unreachable.

    Error messages and ``repr`` never show credentials inside ``url``.
    """

    def __init__(
        self,
        url: str,
        *,
        auth_token: str | None = None,
        tls_trust_certs_file_path: str | None = None,
        timeout: float = 30.0,
        origin: str = "",
    ) -> None:
        self.url = url.rstrip("/")
        self._origin = origin
        self.timeout = timeout
        self._shown_url = redact_url(self.url)
        self._auth_token = auth_token
        self._session_made: requests.Session | None = None
        self._session_lock = threading.Lock()
        # Per request, not session.verify: requests lets $REQUESTS_CA_BUNDLE override the session's.
        self._verify: str | bool = tls_trust_certs_file_path or True

    def __repr__(self) -> str:
        return f"PulsarAdmin({self._shown_url!r})"

    @property
    def _session(self) -> requests.Session:
        """Made at the first request: a process that never calls the admin API (a task pushing an
        XCom message) does not import ``requests`` (~40 ms of CPU per task process)."""
        with self._session_lock:
            if self._session_made is None:
                import requests

                session = requests.Session()
                if self._auth_token:
                    session.headers["Authorization"] = f"Bearer {self._auth_token}"
                self._session_made = session
            return self._session_made

    @staticmethod
    def topic_path(topic: str) -> str:
        """``persistent://t/ns/name`` -> ``persistent/t/ns/name`` (URL-quoted)."""
        domain, sep, rest = topic.partition("://")
        if not sep or rest.count("/") != 2:
            raise ConfigurationError(f"topic {topic!r} is not fully qualified (persistent://tenant/namespace/name)")
        return domain + "/" + "/".join(quote(part, safe="") for part in rest.split("/"))

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200, 204), **kwargs: Any) -> requests.Response:
        """One request; raises BackendUnavailableError naming the URL and status on failure."""
        url = f"{self.url}/admin/v2/{path}"
        kwargs.setdefault("verify", self._verify)
        session = self._session
        import requests

        try:
            resp = session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise admin_unreachable(
                exc, method, path, url=self.url, shown_url=self._shown_url, origin=self._origin
            ) from None
        check_admin_status(method, path, resp.status_code, resp.text, ok=ok, shown_url=self._shown_url)
        return resp

    def _get_object(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """``GET path`` answered by a JSON object; raises BackendUnavailableError naming the request
        when the answer is another JSON value."""
        return self._json_object(self.request("GET", path, **kwargs), "GET", path)

    def _json_object(self, resp: requests.Response, method: str, path: str) -> dict[str, Any]:
        body = resp.json()
        if not isinstance(body, dict):
            raise BackendUnavailableError(
                f"Pulsar admin API {method} {self._shown_url}/admin/v2/{path} answered a JSON "
                f"{type(body).__name__} where an object was expected: {resp.text[:300]}"
            )
        return body

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """``GET .../stats``: publishers, topicEpoch, waitingPublishers, counters."""
        return self._get_object(f"{self.topic_path(topic)}/stats")

    def topic_exists(self, topic: str) -> bool:
        """Whether the topic exists (asking does not create it, unlike a client lookup)."""
        return self.request("GET", f"{self.topic_path(topic)}/stats", ok=(200, 404)).status_code == 200

    def internal_stats(self, topic: str) -> dict[str, Any]:
        """``GET .../internalStats``: ledgers, lastConfirmedEntry, cursors."""
        return self._get_object(f"{self.topic_path(topic)}/internalStats")

    def namespace_topics(self, tenant: str, namespace: str) -> list[str]:
        """``GET namespaces/{tenant}/{ns}/topics``: allowed to any role that may produce or consume there."""
        return list(
            self.request("GET", f"namespaces/{quote(tenant, safe='')}/{quote(namespace, safe='')}/topics").json()
        )

    def health(self) -> bool:
        """Whether ``/admin/v2/brokers/health`` answers ok."""
        try:
            return self.request("GET", "brokers/health").text.strip().lower() == "ok"
        except BackendUnavailableError:
            return False

    def create_topic(self, topic: str) -> None:
        """Create a non-partitioned topic; one that exists, or a role that may not create, is fine."""
        self.request("PUT", self.topic_path(topic), ok=(200, 204, 401, 403, 409))

    def applied_policy(self, topic: str, policy: str) -> dict[str, Any] | None:
        """The policy in force for ``topic`` (topic, else namespace, else broker level):
        ``GET .../{policy}?applied=true`` with ``policy`` ``retention`` or ``inactiveTopicPolicies``.
        None when this role may not read it (401/403) or the topic does not exist (404)."""
        resp = self.request(
            "GET", f"{self.topic_path(topic)}/{policy}", ok=(200, 401, 403, 404), params={"applied": "true"}
        )
        return (
            resp.json() if resp.status_code == 200 and resp.text.strip() else ({} if resp.status_code == 200 else None)
        )

    def set_policy(self, topic: str, policy: str, value: dict[str, Any]) -> bool:
        """Set a topic-level policy; False when this role may not (401/403)."""
        resp = self.request("POST", f"{self.topic_path(topic)}/{policy}", ok=(200, 204, 401, 403), json=value)
        return resp.status_code in (200, 204)

    def delete_topic(self, topic: str, *, force: bool = True) -> None:
        """Delete a topic (404 is fine)."""
        self.request("DELETE", self.topic_path(topic), ok=(200, 204, 404), params={"force": str(force).lower()})

    # -- offsets (broker entry index; see engine/offsets/pulsar_index.py for what the answers mean) --
    def partition_count(self, topic: str) -> int | None:
        """``GET .../partitions``: 0 for a non-partitioned topic, None when the topic does not exist
        (asking never creates it)."""
        resp = self.request("GET", f"{self.topic_path(topic)}/partitions", ok=(200, 404))
        return int(resp.json().get("partitions", 0)) if resp.status_code == 200 else None

    def message_id_by_index(self, topic: str, index: int) -> requests.Response:
        """``GET .../getMessageIdByIndex``: the entry containing offset ``index``; the caller reads
        200 / 404 (past the tail, or no message) / 412 (no index) / 500 (every ledger trimmed)."""
        return self.request(
            "GET", f"{self.topic_path(topic)}/getMessageIdByIndex", ok=(200, 404, 412, 500), params={"index": index}
        )

    def entry_headers(self, topic: str, ledger: int, entry: int) -> Mapping[str, str] | None:
        """The headers of entry ``ledger:entry`` (``HEAD .../ledger/L/entry/E``, no payload); None
        when it does not exist (404, or the 500 the broker answers for a missing entry of a ledger)."""
        resp = self.request("HEAD", f"{self.topic_path(topic)}/ledger/{ledger}/entry/{entry}", ok=(200, 404, 500))
        return resp.headers if resp.status_code == 200 else None

    def examine_message(self, topic: str, position: str) -> Mapping[str, str] | None:
        """The headers of the first (``position="earliest"``) or last (``"latest"``) retained entry;
        None when no message is retained (412)."""
        resp = self.request(
            "HEAD",
            f"{self.topic_path(topic)}/examinemessage",
            ok=(200, 412),
            params={"initialPosition": position, "messagePosition": 1},
        )
        return resp.headers if resp.status_code == 200 else None

    def message_id_by_time(self, topic: str, timestamp_ms: int) -> dict[str, Any]:
        """``GET .../messageid/{ms}``: the entry of the first message published at or after the time."""
        return self._get_object(f"{self.topic_path(topic)}/messageid/{int(timestamp_ms)}")

    def subscription_properties(self, topic: str, subscription: str) -> dict[str, str] | None:
        """A subscription's properties; None when the subscription does not exist."""
        resp = self.request("GET", f"{self._sub_path(topic, subscription)}/properties", ok=(200, 404))
        return dict(resp.json() or {}) if resp.status_code == 200 else None

    def set_subscription_properties(self, topic: str, subscription: str, properties: Mapping[str, str]) -> bool:
        """Replace a subscription's properties (stored with its cursor; durable on return). False when
        a concurrent update of the cursor won (the broker's BadVersion): read again and retry."""
        resp = self.request(
            "PUT",
            f"{self._sub_path(topic, subscription)}/properties",
            ok=(200, 204, 409, 412, 500),
            json=dict(properties),
        )
        if resp.status_code == 500 and "BadVersion" not in resp.text:
            raise BackendUnavailableError(
                f"Pulsar admin API PUT properties of {subscription} on {topic} answered 500: {resp.text[:300]}"
            )
        return resp.status_code in (200, 204)

    def create_subscription(
        self, topic: str, subscription: str, *, ledger: int, entry: int, properties: Mapping[str, str] | None = None
    ) -> bool:
        """Create a durable subscription whose first unacknowledged entry is ``ledger:entry``
        (``-1, -1``: the earliest), with ``properties`` set in the same request; False when it
        already exists, or is being created or reset by someone else (409, 412).

        The broker creates the cursor at the latest entry and then moves it: a reader of the
        cursor may see the latest position in between, never a reader of the properties."""
        body: dict[str, Any] = {"ledgerId": ledger, "entryId": entry}
        if properties:
            body["properties"] = dict(properties)
        resp = self.request("PUT", self._sub_path(topic, subscription), ok=(200, 204, 409, 412), json=body)
        return resp.status_code in (200, 204)

    def reset_cursor(
        self, topic: str, subscription: str, *, ledger: int, entry: int, batch_index: int = -1, excluded: bool = False
    ) -> bool:
        """Move a subscription's cursor (either way) to ``ledger:entry`` (``excluded``: just after it;
        ``batch_index``: skipping that many messages of the entry for batch-index-ack consumers while
        the topic stays loaded). The entry-level position is durable on return. False when the broker
        could not fence the subscription (412: busy with another reset or ack): retry."""
        body: dict[str, Any] = {"ledgerId": ledger, "entryId": entry, "excluded": excluded}
        if batch_index >= 0:
            body["batchIndex"] = batch_index
        resp = self.request("POST", f"{self._sub_path(topic, subscription)}/resetcursor", ok=(200, 204, 412), json=body)
        return resp.status_code != 412

    def create_partitioned_topic(self, topic: str, partitions: int) -> bool:
        """Create a partitioned topic; False when one of that name exists (409)."""
        resp = self.request("PUT", f"{self.topic_path(topic)}/partitions", ok=(200, 204, 409), json=partitions)
        return resp.status_code != 409

    def create_non_partitioned_topic(self, topic: str) -> bool:
        """Create a non-partitioned topic; False when it exists (409)."""
        return self.request("PUT", self.topic_path(topic), ok=(200, 204, 409)).status_code != 409

    def unload(self, topic: str) -> None:
        """Unload the topic (its ledger is closed and a new one opened on the next load)."""
        self.request("PUT", f"{self.topic_path(topic)}/unload")

    def trim(self, topic: str) -> None:
        """Delete the closed ledgers retention no longer keeps (``POST .../trim``)."""
        self.request("POST", f"{self.topic_path(topic)}/trim")

    def _sub_path(self, topic: str, subscription: str) -> str:
        return f"{self.topic_path(topic)}/subscription/{quote(subscription, safe='')}"

    def close(self) -> None:
        with self._session_lock:
            session, self._session_made = self._session_made, None
        if session is not None:
            session.close()
