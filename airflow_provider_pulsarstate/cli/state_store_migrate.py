"""``airflow pulsarstate state-store-migrate``: move state of the earlier single-map layout into the per-scope maps.

Earlier versions kept every task's and asset's state in one map on ``[pulsarstate]
state_store_topic`` itself (keys ``<namespace>/task/...`` and ``<namespace>/asset/...``, namespace
``airflow`` by default). The backend now reads one map per DAG run and one per asset, and never
that map (every process would replay the whole deployment's state again). Run this once after
upgrading, with the same settings and connection as the workers (see
:mod:`~airflow_provider_pulsarstate.state_store.migrate` for what it guarantees)::

    airflow pulsarstate state-store-migrate --dry-run
    airflow pulsarstate state-store-migrate                       # this namespace and 'airflow'
    airflow pulsarstate state-store-migrate --from-namespace prod
"""

from __future__ import annotations

import argparse

from airflow.cli.cli_config import Arg


def state_store_migrate(args: argparse.Namespace) -> None:
    """The command: move the entries and print the counts."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
    from airflow_provider_pulsarstate.hooks.teams import refuse_shared_team_settings
    from airflow_provider_pulsarstate.provider_settings import settings
    from airflow_provider_pulsarstate.state_store.migrate import migrate_legacy_state

    refuse_shared_team_settings()
    current = settings()
    with PulsarStateHook(current.conn_id) as hook:
        report = migrate_legacy_state(
            hook,
            from_namespaces=args.from_namespace or None,
            dry_run=args.dry_run,
        )
    verb = "would move" if args.dry_run else "moved"
    print(
        f"state-store-migrate: {verb} {report.moved} entries from {report.legacy_topic} into namespace "
        f"{report.namespace!r} ({report.kept_newer} kept: newer in the new layout; {report.expired} expired, dropped; "
        f"{report.other} of other namespaces left in place)"
    )


ARGS = (
    Arg(
        ("--from-namespace",),
        action="append",
        default=None,
        help="Key namespace to move (repeatable; default: this deployment's key_namespace and 'airflow')",
    ),
    Arg(("--dry-run",), action="store_true", help="Report what would be moved, move nothing"),
)
