"""The provider's CLI group, ``airflow pulsarstate`` (listed under ``cli`` in the provider info)."""

from __future__ import annotations

from airflow.cli.cli_config import ActionCommand, GroupCommand

from airflow_provider_pulsarstate.cli import fence_reset, state_store_cleanup, state_store_migrate, xcom_cleanup


def get_cli_commands() -> list[GroupCommand]:
    """``airflow pulsarstate xcom-cleanup``, ``state-store-cleanup``, ``state-store-migrate`` and ``reset-fence``."""
    return [
        GroupCommand(
            name="pulsarstate",
            help="Pulsar State provider commands",
            subcommands=[
                ActionCommand(
                    name="xcom-cleanup",
                    help="Remove XCom entries of runs no longer in the metadata DB or older than a retention",
                    func=xcom_cleanup.xcom_cleanup,
                    args=xcom_cleanup.ARGS,
                    description=xcom_cleanup.__doc__,
                ),
                ActionCommand(
                    name="state-store-cleanup",
                    help="Remove expired task and asset state entries (Airflow's own clean-up skips custom backends)",
                    func=state_store_cleanup.state_store_cleanup,
                    args=state_store_cleanup.ARGS,
                    description=state_store_cleanup.__doc__,
                ),
                ActionCommand(
                    name="state-store-migrate",
                    help="Move task and asset state of the earlier single-map layout into the per-run and per-asset maps",
                    func=state_store_migrate.state_store_migrate,
                    args=state_store_migrate.ARGS,
                    description=state_store_migrate.__doc__,
                ),
                ActionCommand(
                    name="reset-fence",
                    help="Remove a lease fence from a table, with a record in its log (after a forged token)",
                    func=fence_reset.reset_fence,
                    args=fence_reset.ARGS,
                    description=fence_reset.__doc__,
                ),
            ],
        )
    ]
