"""Test support shipped with the provider (like ``kazoo.testing``): use it in your own DAG tests.

* :mod:`.harness`: a fault-injecting back end (lose an acknowledgement, die half-way through a
  record, delay an append, an outage of the whole back end) and :func:`~.harness.wait_until`, a
  polling wait with a deadline.
* :mod:`.broker`: a real Pulsar standalone broker from Maven Central, no Docker.
* :mod:`.airflow_processes`: real ``api-server``, ``scheduler``, ``dag-processor`` and ``triggerer``
  processes on a throw-away AIRFLOW_HOME, for what ``dag.test()`` cannot show (``start_from_trigger``,
  asset watchers, a triggerer killed mid-way).
"""

from airflow_provider_pulsarstate.testing.harness import FaultInjectingBackend, wait_until

__all__ = ["FaultInjectingBackend", "wait_until"]
