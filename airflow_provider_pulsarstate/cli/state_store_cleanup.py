"""``airflow pulsarstate state-store-cleanup``: remove expired task and asset state entries.

Airflow's own ``airflow state-store cleanup`` skips custom backends, so nothing in Airflow removes
expired entries of :class:`~airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend`
(reads already treat them as absent). Run this periodically (cron, or a DAG's BashOperator), with
the same ``[pulsarstate]`` settings and connection as the workers::

    airflow pulsarstate state-store-cleanup
"""

from __future__ import annotations

import argparse


def state_store_cleanup(args: argparse.Namespace) -> None:
    """The command: remove this deployment's expired entries and print how many."""
    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    removed = PulsarStateStoreBackend().cleanup()
    print(f"state-store-cleanup: removed {removed} expired entr{'y' if removed == 1 else 'ies'}")


ARGS = ()
