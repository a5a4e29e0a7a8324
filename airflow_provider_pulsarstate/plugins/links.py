"""Operator extra links from this provider's tasks to the matching item of the "Pulsar State" page.

Airflow 3 computes a task's links in the worker after the task ran (rendered fields, so a
templated topic is its rendered name) and stores them in XCom; the UI shows them on the task
instance. A link opens the page (``/pulsarstate/``) on the right connection, tab and item.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from airflow.sdk import BaseOperatorLink

PAGE_PATH = "/pulsarstate/"


def page_url(**params: str | None) -> str:
    """The page's address with ``params`` (connection, tab, topic, item) in its fragment, absolute
    when ``[api] base_url`` is set."""
    try:
        from airflow.sdk.configuration import conf

        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    except Exception:  # a link must never fail a task
        base = ""
    query = urlencode({k: v for k, v in params.items() if v})
    return f"{base}{PAGE_PATH}#{query}"


def _conn(operator: Any) -> str:
    return str(getattr(operator, "pulsarstate_conn_id", None) or "pulsarstate_default")


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class PulsarStateViewLink(BaseOperatorLink):
    """From a temp-view task (create / apply / drop) to its view on the Views tab."""

    name = "Pulsar State: view"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return page_url(
            conn=_conn(operator),
            tab="views",
            topic=_str(getattr(operator, "table_topic", None)),
            view=_str(getattr(operator, "view_id", None)),
        )


class PulsarStateTableLink(BaseOperatorLink):
    """From a task writing a table (source offsets) to the table on the Tables tab."""

    name = "Pulsar State: table"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return page_url(conn=_conn(operator), tab="tables", topic=_str(getattr(operator, "table_topic", None)))


class PulsarStateLeaseLink(BaseOperatorLink):
    """From a lease task or a leadership sensor to its lease on the Leases tab."""

    name = "Pulsar State: lease"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return page_url(
            conn=_conn(operator),
            tab="leases",
            lease=_str(getattr(operator, "lease_name", None)),
            lease_topic=_str(getattr(operator, "lease_topic", None)),
        )


class PulsarStateSubscriptionLink(BaseOperatorLink):
    """From an offset task or sensor to its subscription's lag on the Subscriptions tab."""

    name = "Pulsar State: subscription"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        topic = _str(getattr(operator, "source_topic", None)) or _str(getattr(operator, "topic", None))
        return page_url(
            conn=_conn(operator),
            tab="subscriptions",
            topic=topic,
            subscription=_str(getattr(operator, "subscription", None)),
        )


ALL_LINKS = (PulsarStateViewLink, PulsarStateTableLink, PulsarStateLeaseLink, PulsarStateSubscriptionLink)
