"""Connection settings shared by every back end, and how a URL picks the back end.

``pulsar://`` and ``pulsar+ssl://`` URLs select a real broker; a file path or ``file://`` URL
selects the embedded single-host log. With nothing configured, the embedded log lives under
``$AIRFLOW_HOME/pulsarstate/state.db`` (``~/airflow`` when AIRFLOW_HOME is unset).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from airflow_provider_pulsarstate.engine.errors import ConfigurationError

PULSAR_SCHEMES = ("pulsar", "pulsar+ssl")
ENV_URL = "PULSARSTATE_URL"
_TOPIC_DOMAINS = ("persistent://", "non-persistent://")


def default_embedded_path() -> Path:
    """Where the embedded log lives when no connection is configured."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.join(os.path.expanduser("~"), "airflow")
    return Path(home) / "pulsarstate" / "state.db"


@dataclass(frozen=True, kw_only=True)
class ConnectionConfig:
    """Everything needed to reach a back end.

    :param url: ``pulsar://host:6650``, ``pulsar+ssl://host:6651``, a file path or ``file:///path``.
        Empty means the embedded default (see :func:`default_embedded_path`).
    :param admin_url: the broker's admin REST URL; derived as ``http://host:8080`` when empty.
    :param tenant: Pulsar tenant for short topic names.
    :param namespace: Pulsar namespace for short topic names.
    :param auth_token: a Pulsar JWT (sent to the broker and the admin API).
    :param tls_trust_certs_file_path: CA bundle for ``pulsar+ssl://`` and ``https://`` admin.
    :param operation_timeout: seconds any single broker operation may take.
    """

    url: str = ""
    admin_url: str = ""
    tenant: str = "public"
    namespace: str = "default"
    auth_token: str | None = field(default=None, repr=False)
    tls_trust_certs_file_path: str | None = None
    operation_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.operation_timeout <= 0:
            raise ConfigurationError(f"operation_timeout must be positive, got {self.operation_timeout!r}")
        self.kind  # validates the URL scheme early

    @classmethod
    def from_env(cls, **overrides: object) -> "ConnectionConfig":
        """The config named by ``$PULSARSTATE_URL`` (embedded default when unset)."""
        return cls(url=os.environ.get(ENV_URL, ""), **overrides)  # type: ignore[arg-type]

    @property
    def kind(self) -> Literal["pulsar", "embedded"]:
        """Which back end the URL selects."""
        if not self.url:
            return "embedded"
        scheme = urlparse(self.url).scheme
        if scheme in PULSAR_SCHEMES:
            return "pulsar"
        if scheme in ("", "file"):
            return "embedded"
        raise ConfigurationError(
            f"unsupported URL scheme {scheme!r} in {self.url!r}: use pulsar://, pulsar+ssl://, "
            "a file path or file:// URL"
        )

    @property
    def embedded_path(self) -> Path:
        """The state file of the embedded back end."""
        if self.kind != "embedded":
            raise ConfigurationError(f"{self.url!r} is not an embedded-log URL")
        if not self.url:
            return default_embedded_path()
        parsed = urlparse(self.url)
        return Path(parsed.path if parsed.scheme == "file" else self.url).expanduser()

    @property
    def resolved_admin_url(self) -> str:
        """The admin REST URL, derived from the service URL when not given."""
        if self.admin_url:
            return self.admin_url.rstrip("/")
        parsed = urlparse(self.url)
        if parsed.scheme == "pulsar+ssl":
            return f"https://{parsed.hostname}:8443"
        return f"http://{parsed.hostname or '127.0.0.1'}:8080"

    def topic_name(self, topic: str) -> str:
        """The fully qualified topic for a short name (``persistent://tenant/ns/name``)."""
        if not topic or not topic.strip():
            raise ConfigurationError("topic name must not be empty")
        if topic.startswith(_TOPIC_DOMAINS):
            return topic
        if "/" in topic:
            raise ConfigurationError(
                f"topic {topic!r}: give a short name or a full persistent://tenant/namespace/name"
            )
        return f"persistent://{self.tenant}/{self.namespace}/{topic}"

    def with_options(self, **changes: object) -> "ConnectionConfig":
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


DEFAULT_MAX_DELETE_FRACTION = 0.5
"""Temp views: by default apply refuses a diff that deletes more than half of the rows in the view's scope."""
