"""Connection settings shared by every back end, and how a URL picks the back end.

``pulsar://`` and ``pulsar+ssl://`` URLs select a real broker; a file path or ``file://`` URL
selects the embedded single-host log. With nothing configured, the embedded log lives under
``$AIRFLOW_HOME/pulsarstate/state.db`` (``~/airflow`` when AIRFLOW_HOME is unset).
"""

from __future__ import annotations

import ipaddress
import os
import warnings
from dataclasses import InitVar, dataclass, field, fields, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse, urlsplit, urlunsplit

from airflow_provider_pulsarstate.engine.errors import ConfigurationError

PULSAR_SCHEMES = ("pulsar", "pulsar+ssl")
ENV_URL = "PULSARSTATE_URL"
_TOPIC_DOMAINS = ("persistent://", "non-persistent://")


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@`` (for messages and reprs)."""
    if not url or "@" not in url or "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def url_secrets(url: str) -> list[str]:
    """The credentials inside ``url`` (user info), to register for log masking."""
    if not url or "://" not in url:
        return []
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    return [s for s in (parts.password, parts.username if parts.password is None else None) if s]


def is_loopback_host(host: str | None) -> bool:
    """Whether ``host`` names this machine (``localhost`` or a loopback address)."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
    :param tls_hostname_verification: check that the broker's TLS certificate names the host
        (on by default; turn off only for test certificates).
    :param allow_plaintext_auth: allow sending ``auth_token`` over plain ``http://`` to a host
        that is not loopback (off: such a config is refused).
    :param allow_other_namespaces: accept full topic names outside ``tenant/namespace`` (off: a
        full name must be in the connection's own namespace).
    :param source: where these settings come from, e.g. ``connection 'x'`` (not compared): errors
        of an unreachable broker name it and the field (:meth:`field_origin`).
    :param allow_insecure_token: deprecated spelling of ``allow_plaintext_auth`` (a DeprecationWarning;
        true turns ``allow_plaintext_auth`` on).
    """

    url: str = ""
    admin_url: str = ""
    tenant: str = "public"
    namespace: str = "default"
    auth_token: str | None = field(default=None, repr=False)
    tls_trust_certs_file_path: str | None = None
    operation_timeout: float = 30.0
    tls_hostname_verification: bool = True
    allow_plaintext_auth: bool = False
    allow_other_namespaces: bool = False
    source: str = field(default="", compare=False)
    allow_insecure_token: InitVar[bool | None] = None

    def __post_init__(self, allow_insecure_token: bool | None) -> None:
        if allow_insecure_token is not None:
            warnings.warn(
                "ConnectionConfig(allow_insecure_token=...) is deprecated: use allow_plaintext_auth",
                DeprecationWarning,
                stacklevel=3,
            )
            if allow_insecure_token:
                object.__setattr__(self, "allow_plaintext_auth", True)
        if self.operation_timeout <= 0:
            raise ConfigurationError(f"operation_timeout must be positive, got {self.operation_timeout!r}")
        _ = self.kind  # validates the URL scheme early
        if self.kind == "embedded":
            _ = self.embedded_path  # validates a file:// URL early
        elif self.auth_token and not self.allow_plaintext_auth:
            admin = urlparse(self.resolved_admin_url)
            if admin.scheme != "https" and not is_loopback_host(admin.hostname):
                raise ConfigurationError(
                    f"admin_url {redact_url(self.resolved_admin_url)!r} is plain {admin.scheme}:// to a host "
                    "that is not loopback: the auth token would travel unencrypted. Use an https:// admin_url "
                    "(a pulsar+ssl:// service URL derives one), or set allow_plaintext_auth to accept the risk"
                )

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "auth_token":
                value = None if value is None else "***"
            elif f.name in ("url", "admin_url"):
                value = redact_url(value)
            shown.append(f"{f.name}={value!r}")
        return f"ConnectionConfig({', '.join(shown)})"

    def field_origin(self, name: str) -> str:
        """`` (connection 'x', field 'admin_url')`` for error messages; empty without a :attr:`source`."""
        return f" ({self.source}, field {name!r})" if self.source else ""

    @classmethod
    def from_env(cls, **overrides: object) -> ConnectionConfig:
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
            f"unsupported URL scheme {scheme!r} in {redact_url(self.url)!r}: use pulsar://, pulsar+ssl://, "
            "a file path or file:// URL"
        )

    @property
    def is_single_host(self) -> bool:
        """Whether the state is a file on this host (:attr:`embedded_path`), which only processes
        on this host reach: not for executors or Spark workers elsewhere."""
        return self.kind == "embedded"

    @property
    def has_subscriptions(self) -> bool:
        """Whether the back end has subscription consumers and message ids (a broker): topic
        streams with negative acknowledgements and dead letters, and messages read by id."""
        return self.kind == "pulsar"

    @property
    def embedded_path(self) -> Path:
        """The state file of the embedded back end."""
        if self.kind != "embedded":
            raise ConfigurationError(f"{redact_url(self.url)!r} is not an embedded-log URL")
        if not self.url:
            return default_embedded_path()
        parsed = urlparse(self.url)
        if parsed.scheme != "file":
            return Path(self.url).expanduser()
        if parsed.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"file URL {redact_url(self.url)!r} has a host part ({parsed.netloc!r}), which would be dropped "
                f"from the path; write file:///{parsed.netloc}{parsed.path} for an absolute path"
            )
        return Path(parsed.path)

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
        """The fully qualified state topic for a short name (``persistent://tenant/ns/name``).

        :raises ConfigurationError: empty name; a ``non-persistent://`` topic (it keeps no
            messages, so it cannot hold state); a full name outside the connection's
            ``tenant/namespace`` unless ``allow_other_namespaces``.
        """
        if not topic or not topic.strip():
            raise ConfigurationError("topic name must not be empty")
        if topic.startswith("non-persistent://"):
            raise ConfigurationError(
                f"topic {topic!r}: a non-persistent topic keeps no messages and cannot hold state; use persistent://"
            )
        if topic.startswith(_TOPIC_DOMAINS):
            rest = topic[len("persistent://") :]
            parts = rest.split("/")
            if len(parts) != 3 or not all(parts):
                raise ConfigurationError(f"topic {topic!r} is not persistent://tenant/namespace/name")
            if (parts[0], parts[1]) != (self.tenant, self.namespace) and not self.allow_other_namespaces:
                raise ConfigurationError(
                    f"topic {topic!r} is outside the connection's namespace {self.tenant}/{self.namespace}; "
                    "use a short name, or set allow_other_namespaces on the connection"
                )
            return topic
        if "/" in topic:
            raise ConfigurationError(f"topic {topic!r}: give a short name or a full persistent://tenant/namespace/name")
        return f"persistent://{self.tenant}/{self.namespace}/{topic}"

    def with_options(self, **changes: object) -> ConnectionConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


DEFAULT_MAX_DELETE_FRACTION = 0.5
"""Temp views: by default apply refuses a diff that deletes more than half of the rows in the view's scope."""
