"""The ``pulsarstate`` connection type: its form fields, defined once.

Airflow 3.3 builds the connection form from the provider metadata (``conn-fields`` and
``ui-field-behaviour`` in :mod:`airflow_provider_pulsarstate.provider_info`) without importing the
hook, so this module imports nothing from Airflow. :class:`~.pulsarstate.PulsarStateHook` reads the
same names back from the connection's extra.

Each field is stored under its own name in the connection's extra, e.g.
``{"service_url": "pulsar://localhost:6650", "operation_timeout": 10}``; the legacy prefixed form
``extra__pulsarstate__service_url`` is accepted too.

No field that is not a secret carries a word Airflow treats as sensitive in its name (``token``,
``password``, ``secret``, ``key``, ...): the form would show and save its value as ``***``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Final

from airflow_provider_pulsarstate.engine.config import ConnectionConfig

CONN_TYPE: Final = "pulsarstate"
HOOK_NAME: Final = "Pulsar State"
HOOK_CLASS_NAME: Final = "airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook"
LEGACY_EXTRA_PREFIX: Final = f"extra__{CONN_TYPE}__"

_DEFAULTS = {f.name: f.default for f in fields(ConnectionConfig)}
_OPTIONAL_STRING = ["string", "null"]

CONN_FIELDS: Final[dict[str, dict[str, Any]]] = {
    "service_url": {
        "label": "Service URL",
        "description": (
            "pulsar://host:6650 or pulsar+ssl://host:6651 for a Pulsar broker; a file path or file:// URL "
            "for the embedded single-host log. Empty: the embedded log under "
            "$AIRFLOW_HOME/pulsarstate/state.db."
        ),
        "schema": {
            "type": _OPTIONAL_STRING,
            "examples": [
                "pulsar://localhost:6650",
                "pulsar+ssl://localhost:6651",
                "file:///var/lib/pulsarstate/state.db",
            ],
        },
    },
    "admin_url": {
        "label": "Admin URL",
        "description": (
            "The broker's admin REST URL. Empty: derived from the service URL "
            "(http://host:8080, or https://host:8443 for pulsar+ssl)."
        ),
        "schema": {"type": _OPTIONAL_STRING, "examples": ["http://localhost:8080"]},
    },
    "tenant": {
        "label": "Tenant",
        "description": "Pulsar tenant of short topic names.",
        "schema": {"type": _OPTIONAL_STRING, "default": _DEFAULTS["tenant"]},
    },
    "namespace": {
        "label": "Namespace",
        "description": "Pulsar namespace of short topic names.",
        "schema": {"type": _OPTIONAL_STRING, "default": _DEFAULTS["namespace"]},
    },
    "auth_token": {
        "label": "Auth token",
        "description": "A Pulsar JWT, sent to the broker and to the admin API. Empty: the connection password, if any.",
        "schema": {"type": _OPTIONAL_STRING, "format": "password"},
    },
    "tls_trust_certs_file_path": {
        "label": "TLS trust certificates file",
        "description": "CA bundle (PEM) for pulsar+ssl:// and https:// admin URLs.",
        "schema": {"type": _OPTIONAL_STRING},
    },
    "operation_timeout": {
        "label": "Operation timeout (seconds)",
        "description": "Seconds any single broker or state-file operation may take.",
        "schema": {"type": ["number", "null"], "default": _DEFAULTS["operation_timeout"], "exclusiveMinimum": 0},
    },
    "tls_hostname_verification": {
        "label": "Verify TLS host names",
        "description": "Check that the broker's TLS certificate names the host (pulsar+ssl://). Turn off only for test certificates.",
        "schema": {"type": ["boolean", "null"], "default": _DEFAULTS["tls_hostname_verification"]},
    },
    "allow_plaintext_auth": {
        "label": "Allow the token over plain http",
        "description": (
            "Send the auth token to a plain http:// admin URL on a host that is not loopback. Off: such a "
            "connection is refused; use https:// instead."
        ),
        "schema": {"type": ["boolean", "null"], "default": _DEFAULTS["allow_plaintext_auth"]},
    },
    "allow_other_namespaces": {
        "label": "Allow topics of other namespaces",
        "description": "Accept full topic names outside this connection's tenant/namespace. Off: such names are refused.",
        "schema": {"type": ["boolean", "null"], "default": _DEFAULTS["allow_other_namespaces"]},
    },
}
"""``conn-fields`` of the connection type: ``{name: {label, description, schema}}`` (Airflow 3.3 format)."""

UI_FIELD_BEHAVIOUR: Final[dict[str, Any]] = {
    # Everything lives in the fields above; host and password are still read as fallbacks
    # (service URL, auth token) for connections written in the URI or JSON form.
    "hidden-fields": ["host", "port", "schema", "login", "password"],
    "relabeling": {},
    # Airflow 3.3 renders placeholders for the standard fields only (all hidden here); the
    # extra fields carry ``examples`` in their schema instead, which the form offers as choices.
    "placeholders": {},
}
"""``ui-field-behaviour`` of the connection type (provider-info, kebab-case keys)."""

SECRET_FIELDS: Final = frozenset(
    name for name, spec in CONN_FIELDS.items() if spec["schema"].get("format") == "password"
)
"""Fields whose value is a secret (the form masks them, and so does Airflow by their name)."""

RENAMED_FIELDS: Final[dict[str, str]] = {"allow_insecure_token": "allow_plaintext_auth"}
"""Old extra keys still read from connections saved earlier (with a DeprecationWarning) -> their new name."""

FIELD_NAMES: Final = frozenset(CONN_FIELDS)
"""The extra keys a ``pulsarstate`` connection may carry (besides the old names of :data:`RENAMED_FIELDS`)."""
