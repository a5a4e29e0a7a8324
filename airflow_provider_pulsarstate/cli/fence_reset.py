"""``airflow pulsarstate reset-fence``: remove a lease fence from a table, with a record in its log.

For a fence raised by a token no lease log granted (a frame forged with a writer of its own, or
written by a version that did not check grants): every guarded write under that lease name is
refused until it goes. Every replica applies the reset at the same offset, and checkpoints after
it do not hold the fence. Until the next guarded write sets it again, older holders are not
fenced: reset while no stale holder can write::

    airflow pulsarstate reset-fence --topic prices --lease nightly-load
    airflow pulsarstate reset-fence --topic prices --lease nightly-load --lease-log pulsarstate-leases
"""

from __future__ import annotations

import argparse

from airflow.cli.cli_config import Arg


def reset_fence(args: argparse.Namespace) -> None:
    """The command: reset the fence through the hook and print what was removed."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    with PulsarStateHook(args.conn_id) as hook:
        removed = hook.reset_fence(args.topic, lease=args.lease, lease_log=args.lease_log)
        topic = hook.topic_name(args.topic)
    scope = args.lease_log or "every lease log"
    print(f"reset-fence: fence of lease {args.lease!r} ({scope}) reset on {topic}; the reset is recorded in its log")
    for (lease_log, name), token in sorted(removed.items()):
        print(f"  removed: lease {name!r} of lease log {lease_log or '(name only, earlier versions)'}: token {token}")
    if not removed:
        print("  removed: none (there was no such fence)")


ARGS = (
    Arg(("--topic",), required=True, help="The table or map whose fence to reset (short name or persistent://...)"),
    Arg(("--lease",), required=True, help="The lease name"),
    Arg(("--lease-log",), default=None, help="Only the fence of this lease log (default: of every lease log)"),
    Arg(
        ("--conn-id",), default="pulsarstate_default", help="The pulsarstate connection (default: pulsarstate_default)"
    ),
)
