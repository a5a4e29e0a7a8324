"""Pulsar topic policies a state log needs: infinite retention, no deletion while inactive.

Pulsar's defaults keep no retention and delete inactive topics (a topic with no producer and no
subscription), which deletes a state log a few minutes after its last writer and reader left.
:func:`ensure_topic_policies` checks the policies in force for one topic (``?applied=true``:
topic level, else namespace, else broker) and sets topic-level ones when they would lose the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.backends.admin import PulsarAdmin
from airflow_provider_pulsarstate.engine.errors import RetentionPolicyError

log = logging.getLogger(__name__)

RETENTION = "retention"
INACTIVE = "inactiveTopicPolicies"
INFINITE_RETENTION: dict[str, Any] = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
NEVER_DELETE: dict[str, Any] = {
    "deleteWhileInactive": False,
    "maxInactiveDurationSeconds": 3600,
    "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
}


def _retention_ok(policy: dict[str, Any]) -> bool:
    return policy.get("retentionTimeInMinutes") == -1 and policy.get("retentionSizeInMB") == -1


def _inactive_ok(policy: dict[str, Any]) -> bool:
    return policy.get("deleteWhileInactive") is False


_CHECKS: dict[str, tuple[Callable[[dict[str, Any]], bool], dict[str, Any]]] = {
    RETENTION: (_retention_ok, INFINITE_RETENTION),
    INACTIVE: (_inactive_ok, NEVER_DELETE),
}


def fix_commands(topic: str, policy: str) -> str:
    """The ``pulsar-admin`` commands that make ``policy`` safe for ``topic`` (topic or namespace level)."""
    namespace = topic.partition("://")[2].rsplit("/", 1)[0]
    if policy == RETENTION:
        args = "--time -1 --size -1"
        return f"`pulsar-admin topics set-retention {topic} {args}` or `pulsar-admin namespaces set-retention {namespace} {args}`"
    args = "--disable-delete-while-inactive --max-inactive-duration 1h --delete-mode delete_when_no_subscriptions"
    return (
        f"`pulsar-admin topics set-inactive-topic-policies {topic} {args}` or "
        f"`pulsar-admin namespaces set-inactive-topic-policies {namespace} {args}`"
    )


def _setting(policy: str) -> str:
    return "retention" if policy == RETENTION else "inactive-topic deletion"


def ensure_topic_policies(admin: PulsarAdmin, topic: str, *, timeout: float) -> None:
    """Make ``topic``'s applied retention infinite and inactive-topic deletion off.

    The topic is created first (topic-level policies need it), then each policy is read and, when
    it would lose the log, set at topic level and read back until the broker applies it. The
    caller then holds a producer or reader on it, so the topic is never idle while unprotected
    for longer than this call.

    A role that may not read the policies gets a warning (the settings cannot be verified, the
    log is used as is); a role that may read but not fix a destructive policy gets an error.

    :raises RetentionPolicyError: a policy would lose the log and could not be set; names the
        setting, its value and the ``pulsar-admin`` commands that fix it.
    """
    admin.create_topic(topic)
    for policy, (ok, safe) in _CHECKS.items():
        applied = admin.applied_policy(topic, policy)
        if applied is None:
            log.warning(
                "%s: cannot read its %s policy (permission denied or topic not visible); make sure the log is kept: %s",
                topic,
                _setting(policy),
                fix_commands(topic, policy),
            )
            continue
        if ok(applied):
            continue
        before = applied
        if not admin.set_policy(topic, policy, safe):
            raise RetentionPolicyError(
                f"{topic}: the {_setting(policy)} policy in force ({applied}) would delete the state log, and this "
                f"role may not set a topic policy. Fix it with {fix_commands(topic, policy)}",
                topic=topic,
                setting=_setting(policy),
            )
        deadline = time.monotonic() + timeout
        while not ok(applied := admin.applied_policy(topic, policy) or {}):  # topic policies apply asynchronously
            if time.monotonic() >= deadline:
                raise RetentionPolicyError(
                    f"{topic}: set the topic-level {_setting(policy)} policy to {safe} but the broker still applies "
                    f"{applied} after {timeout:.0f}s; fix it with {fix_commands(topic, policy)}",
                    topic=topic,
                    setting=_setting(policy),
                )
            time.sleep(0.1)
        log.info("%s: set topic-level %s policy %s (was %s)", topic, _setting(policy), safe, before)
