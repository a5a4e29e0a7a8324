"""A small client for the Pulsar admin REST API (the endpoints this project needs).

No maintained Python admin library exists (see REFERENCE §3); ``requests`` is enough. Every call
is bounded by the connection's operation time-out and raises our own errors.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import requests

from airflow_provider_pulsarstate.engine.config import redact_url
from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, ConfigurationError


class PulsarAdmin:
    """Admin REST calls for topics of one broker.

    :param url: the admin base URL, e.g. ``http://127.0.0.1:8080``.
    :param auth_token: sent as a Bearer token when given.
    :param tls_trust_certs_file_path: CA bundle for https, passed with every request (so
        ``$REQUESTS_CA_BUNDLE`` / ``$CURL_CA_BUNDLE`` cannot replace it); without it the system
        CAs (or those variables) apply.
    :param timeout: seconds per request.

    Error messages and ``repr`` never show credentials inside ``url``.
    """

    def __init__(
        self, url: str, *, auth_token: str | None = None, tls_trust_certs_file_path: str | None = None, timeout: float = 30.0
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._shown_url = redact_url(self.url)
        self._session = requests.Session()
        if auth_token:
            self._session.headers["Authorization"] = f"Bearer {auth_token}"
        # Per request, not session.verify: requests lets $REQUESTS_CA_BUNDLE override the session's.
        self._verify: str | bool = tls_trust_certs_file_path or True

    def __repr__(self) -> str:
        return f"PulsarAdmin({self._shown_url!r})"

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
        shown = f"{self._shown_url}/admin/v2/{path}"
        kwargs.setdefault("verify", self._verify)
        try:
            resp = self._session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            detail = str(exc).replace(self.url, self._shown_url)
            raise BackendUnavailableError(
                f"Pulsar admin API {self._shown_url} unreachable ({method} {shown}): {type(exc).__name__}: {detail}"
            ) from None
        if resp.status_code not in ok:
            raise BackendUnavailableError(
                f"Pulsar admin API {method} {shown} answered {resp.status_code}: {resp.text[:300]}"
            )
        return resp

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """``GET .../stats``: publishers, topicEpoch, waitingPublishers, counters."""
        return self.request("GET", f"{self.topic_path(topic)}/stats").json()

    def topic_exists(self, topic: str) -> bool:
        """Whether the topic exists (asking does not create it, unlike a client lookup)."""
        return self.request("GET", f"{self.topic_path(topic)}/stats", ok=(200, 404)).status_code == 200

    def internal_stats(self, topic: str) -> dict[str, Any]:
        """``GET .../internalStats``: ledgers, lastConfirmedEntry, cursors."""
        return self.request("GET", f"{self.topic_path(topic)}/internalStats").json()

    def namespace_topics(self, tenant: str, namespace: str) -> list[str]:
        """``GET namespaces/{tenant}/{ns}/topics``: allowed to any role that may produce or consume there."""
        return list(self.request("GET", f"namespaces/{quote(tenant, safe='')}/{quote(namespace, safe='')}/topics").json())

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
        resp = self.request("GET", f"{self.topic_path(topic)}/{policy}", ok=(200, 401, 403, 404), params={"applied": "true"})
        return resp.json() if resp.status_code == 200 and resp.text.strip() else ({} if resp.status_code == 200 else None)

    def set_policy(self, topic: str, policy: str, value: dict[str, Any]) -> bool:
        """Set a topic-level policy; False when this role may not (401/403)."""
        resp = self.request("POST", f"{self.topic_path(topic)}/{policy}", ok=(200, 204, 401, 403), json=value)
        return resp.status_code in (200, 204)

    def delete_topic(self, topic: str, *, force: bool = True) -> None:
        """Delete a topic (404 is fine)."""
        self.request("DELETE", self.topic_path(topic), ok=(200, 204, 404), params={"force": str(force).lower()})

    def close(self) -> None:
        self._session.close()
