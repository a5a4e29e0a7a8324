"""An Airflow connection of type ``pulsarstate`` read into a :class:`ConnectionConfig`.

The fields read are the connection form's (:mod:`~airflow_provider_pulsarstate.hooks.connection_form`):
the extra's keys, the host standing in for ``service_url`` and the password for ``auth_token``.
Every error names the connection and the field; secrets are registered with Airflow's log masker
before parsing can fail.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig, url_secrets
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.connection_form import (
    CONN_TYPE,
    FIELD_NAMES,
    LEGACY_EXTRA_PREFIX,
    RENAMED_FIELDS,
)

log = logging.getLogger(__name__)

_STRING_FIELDS = ("service_url", "admin_url", "tenant", "namespace", "auth_token", "tls_trust_certs_file_path")
_BOOL_FIELDS = ("tls_hostname_verification", "allow_plaintext_auth", "allow_other_namespaces")

_Fail = Callable[[str, str], ConfigurationError]


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
    values = _string_values(fields, fail)
    url_field = "service_url"
    if "service_url" not in values and host and host.strip():
        values["service_url"], url_field = _service_url_of_host(host.strip(), fail), "host"
    if "auth_token" not in values and password:
        values["auth_token"] = password
    values.update(_bool_values(fields, fail))
    timeout = fields.get("operation_timeout")
    if timeout is not None and not (isinstance(timeout, str) and not timeout.strip()):
        values["operation_timeout"] = _parse_seconds(timeout, lambda problem: fail("operation_timeout", problem))
    return _build(conn_id, values, url_field, fail)


def _string_values(fields: dict[str, Any], fail: _Fail) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in _STRING_FIELDS:
        raw = fields.get(name)
        if raw is None:
            continue
        if not isinstance(raw, str):
            raise fail(name, f"must be a string, got {type(raw).__name__} {raw!r}")
        if raw.strip():
            values[name] = raw.strip()
    return values


def _service_url_of_host(candidate: str, fail: _Fail) -> str:
    if "://" not in candidate and not candidate.startswith(("/", "~", ".")):
        raise fail(
            "host",
            f"{candidate!r} is neither a URL nor a path; set service_url to e.g. pulsar://{candidate}:6650",
        )
    return candidate


def _bool_values(fields: dict[str, Any], fail: _Fail) -> dict[str, bool]:
    values: dict[str, bool] = {}
    for name in _BOOL_FIELDS:
        raw = fields.get(name)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            continue
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            raw = raw.strip().lower() == "true"
        if not isinstance(raw, bool):
            raise fail(name, f"must be true or false, got {raw!r}")
        values[name] = raw
    return values


def _build(conn_id: str, values: dict[str, Any], url_field: str, fail: _Fail) -> ConnectionConfig:
    config_args: dict[str, Any] = {("url" if k == "service_url" else k): v for k, v in values.items()}
    try:
        ConnectionConfig(url=config_args.get("url", ""))  # the URL scheme, on its own
    except ConfigurationError as exc:
        raise fail(url_field, str(exc)) from None
    try:
        return ConnectionConfig(**config_args, source=f"connection {conn_id!r}")
    except ConfigurationError as exc:  # the URLs together (token over plain http, file URL host)
        raise ConfigurationError(f"connection {conn_id!r}: {exc}") from None


def _parse_extra(conn_id: str, extra: str | dict[str, Any] | None, fail: _Fail) -> dict[str, Any]:
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


def _parse_seconds(raw: Any, fail: Callable[[str], ConfigurationError]) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise fail(f"must be a number of seconds, got {type(raw).__name__} {raw!r}")
    try:
        seconds = float(raw)
    except ValueError:
        raise fail(f"must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise fail(f"must be a positive number of seconds, got {raw!r}")
    return seconds


def extra_dict(extra: str | dict[str, Any] | None) -> dict[str, Any]:
    """The extra as a dict, whatever it holds (empty when it is not a JSON object)."""
    if isinstance(extra, dict):
        return extra
    try:
        data = json.loads(extra) if extra else {}
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def mask_secrets(token: str | None, url: str | None, extra: dict[str, Any]) -> None:
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
