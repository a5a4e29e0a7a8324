"""``spark-submit`` for jobs that stage rows into a temp view (the Spark provider is required)."""

from __future__ import annotations

import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.spark.views import AUTH_TOKEN_ENV

if TYPE_CHECKING:
    from airflow.sdk import Context


class ViewSparkSubmitOperator(SparkSubmitOperator):
    """A SparkSubmitOperator that hands the job what it needs to reach the state back end.

    At run time, in the worker:

    * the ``pulsarstate`` connection's auth token, if any, is put into the job's environment as
      ``$PULSARSTATE_AUTH_TOKEN`` (read by :func:`~airflow_provider_pulsarstate.spark.load_config`),
      so it appears in no command line, XCom or rendered template;
    * with a ``local`` master, ``PYSPARK_PYTHON`` defaults to the worker's own Python (where this
      provider is installed), and ``spark-submit`` is looked up next to it when it is not on
      ``PATH`` (a virtualenv that was not activated).

    * an embedded ``pulsarstate`` config (a file on this host) with a non-local Spark master (or
      a missing Spark connection) fails the task before submitting: the executors could not reach
      the file and would stage into private ones.

    Everything else is SparkSubmitOperator's; ``env_vars`` you pass take precedence.

    :param pulsarstate_conn_id: the ``pulsarstate`` connection whose token to pass.
    """

    def __init__(self, *, pulsarstate_conn_id: str = PulsarStateHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def execute(self, context: "Context") -> None:
        from airflow.sdk.log import mask_secret

        env = {str(k): str(v) for k, v in (self.env_vars or {}).items()}
        config = PulsarStateHook(self.pulsarstate_conn_id).get_config()
        if config.kind == "embedded" and not _is_local_master(self._conn_id):
            raise AirflowFailException(
                f"the pulsarstate connection {self.pulsarstate_conn_id!r} uses the embedded state log "
                f"({config.embedded_path}), a file on this host that executors of the non-local Spark master "
                f"of connection {self._conn_id!r} cannot reach (their rows would go to private files). Configure a "
                f"pulsarstate connection to a Pulsar cluster: create {self.pulsarstate_conn_id!r} (type 'pulsarstate') "
                f"or set AIRFLOW_CONN_{self.pulsarstate_conn_id.upper()}"
            )
        token = config.auth_token
        if token:
            mask_secret(token)
            env.setdefault(AUTH_TOKEN_ENV, token)
        if _is_local_master(self._conn_id):
            env.setdefault("PYSPARK_PYTHON", sys.executable)
            bin_dir = os.path.dirname(sys.executable)
            path = env.get("PATH", os.environ.get("PATH", ""))
            if shutil.which("spark-submit", path=path) is None and os.path.exists(os.path.join(bin_dir, "spark-submit")):
                env["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir
        self.env_vars = env or None
        self._hook = None  # rebuilt with the environment above
        return super().execute(context)


def _is_local_master(spark_conn_id: str) -> bool:
    try:
        conn = BaseHook.get_connection(spark_conn_id)
    except AirflowNotFoundException:
        return False
    return (conn.host or "").strip().startswith("local")
