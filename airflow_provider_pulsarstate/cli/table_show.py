"""``airflow pulsarstate table-show``: print a table's committed rows as one JSON object.

Read-only: the latest committed rows of the table (key -> row), sorted by key, on one line, so a
script or a test can compare them::

    airflow pulsarstate table-show --topic price-events-table
    airflow pulsarstate table-show --topic price-events-table --prefix sku-0001
"""

from __future__ import annotations

import argparse
import json

from airflow.cli.cli_config import Arg


def table_show(args: argparse.Namespace) -> None:
    """The command: the table's rows (those under ``--prefix`` if given) as JSON."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    with PulsarStateHook(args.conn_id) as hook, hook.get_table(args.topic) as table:
        rows = table.to_dict(latest=True)
    if args.prefix:
        rows = {key: row for key, row in rows.items() if key.startswith(args.prefix)}
    print(json.dumps(rows, sort_keys=True, default=str), flush=True)


ARGS = (
    Arg(("--topic",), required=True, help="The table (short name or persistent://...)"),
    Arg(("--prefix",), default=None, help="Only the rows whose key starts with this"),
    Arg(
        ("--conn-id",), default="pulsarstate_default", help="The pulsarstate connection (default: pulsarstate_default)"
    ),
)
