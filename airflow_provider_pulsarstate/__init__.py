"""airflow-provider-pulsarstate: shared state for pipelines, kept in an Apache Pulsar topic.

Laid out like an Airflow provider: ``hooks`` (the one hook every other part goes through),
``operators``, ``spark`` (PySpark helpers, no Airflow imports), ``testing`` (a harness for your own
tests) and ``engine``, the state engine itself, which imports nothing from Airflow. The names
below are the engine's public API, re-exported for convenience.
"""

from __future__ import annotations

__version__ = "0.1.0"

from airflow_provider_pulsarstate.engine import *  # noqa: F401,F403 - the public API
from airflow_provider_pulsarstate.engine import __all__ as _engine_all


def get_provider_info() -> dict:
    """Airflow provider metadata (entry point ``apache_airflow_provider``)."""
    from airflow_provider_pulsarstate.provider_info import provider_info

    return provider_info()


__all__ = [*_engine_all, "get_provider_info"]
