"""``spark-submit`` for jobs that stage rows into a temp view, and under a lease (the ``[spark]`` extra is required:
importing this module without it raises :class:`MissingExtraError` with the install command)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.airflow_internals import spark_submit_command, spark_submit_master
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.lineage.facets import openlineage_available
from airflow_provider_pulsarstate.lineage.operators import TaskLineageMixin, record_job_arguments, record_topics
from airflow_provider_pulsarstate.operators.leases import LeaseGuardMixin
from airflow_provider_pulsarstate.spark.requirement import missing_spark
from airflow_provider_pulsarstate.spark.views import AUTH_TOKEN_ENV

try:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
except ImportError as exc:
    raise missing_spark("airflow_provider_pulsarstate.operators.spark_submit (SparkSubmitOperator)", exc) from exc

if TYPE_CHECKING:
    from airflow.sdk import Context


class GuardedSparkSubmitOperator(TaskLineageMixin, LeaseGuardMixin, SparkSubmitOperator):
    """A SparkSubmitOperator that runs only while its DAG run holds a lease (see
    :class:`~airflow_provider_pulsarstate.operators.leases.LeaseGuardMixin`).

    The lease is renewed before ``spark-submit`` starts and every ``ttl / 3`` while it runs; when a
    renewal finds the lease lost, the job is killed (``on_kill``: the spark-submit process, or
    the driver on a cluster) and the task fails naming the lease, its token and the new holder.
    Without ``lease_task_id`` it is a plain SparkSubmitOperator.

    The job's code is opaque to Airflow, so its lineage is declared: ``input_topics`` and
    ``output_topics`` (templated; short names are placed in the ``pulsarstate`` connection's
    tenant and namespace) are reported to OpenLineage as the task's inputs and outputs, on
    completion and on failure. The Spark provider's parent-job injection
    (``[openlineage] spark_inject_parent_job_info``) applies as to any SparkSubmitOperator.

    :param input_topics: topics the job reads.
    :param output_topics: topics the job writes.
    :param pulsarstate_conn_id: the ``pulsarstate`` connection of the lease and the topics.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "input_topics", "output_topics")

    def __init__(
        self,
        *,
        input_topics: Sequence[str] = (),
        output_topics: Sequence[str] = (),
        pulsarstate_conn_id: str = PulsarStateHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.input_topics = input_topics
        self.output_topics = output_topics
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def execute(self, context: Context) -> Any:
        if (self.input_topics or self.output_topics) and openlineage_available():
            config = PulsarStateHook(self.pulsarstate_conn_id).get_config()
            if lineage := self.start_lineage(config):
                record_topics(lineage, config, inputs=self.input_topics, outputs=self.output_topics)
        return super().execute(context)


class ViewSparkSubmitOperator(TaskLineageMixin, LeaseGuardMixin, SparkSubmitOperator):
    """A SparkSubmitOperator that hands the job what it needs to reach the state back end.

    At run time, in the worker:

    * the ``pulsarstate`` connection's auth token, if any, is put into the job's environment as
      ``$PULSARSTATE_AUTH_TOKEN`` (read by :func:`~airflow_provider_pulsarstate.spark.load_config`)
      and registered for log masking. It appears in no XCom or rendered template, and the
      operator checks the ``spark-submit`` command line it would run: on masters where the Spark
      provider turns ``env_vars`` into ``--conf`` arguments (YARN, Kubernetes) the token would
      land in argv, so the task fails with :class:`ConfigurationError` before anything runs.
      There, give the job the token another way and pass ``pass_token=False``: a file readable by
      the job named by ``token_file`` in its config JSON (only the path travels in argv), or
      ``$PULSARSTATE_AUTH_TOKEN`` set by the cluster (e.g. a Kubernetes secret through
      ``spark.kubernetes.driver.secretKeyRef.PULSARSTATE_AUTH_TOKEN``);
    * with a ``local`` master, ``PYSPARK_PYTHON`` defaults to the worker's own Python (where this
      provider is installed), and ``spark-submit`` is looked up next to it when it is not on
      ``PATH`` (a virtualenv that was not activated).

    * an embedded ``pulsarstate`` config (a file on this host) with a non-local Spark master (or
      a missing Spark connection) fails the task before submitting: the executors could not reach
      the file and would stage into private ones.

    * with ``lease_task_id`` (set by :meth:`~airflow_provider_pulsarstate.operators.leases.LeaseTaskGroup.guard`),
      the job runs only under the lease, as in :class:`GuardedSparkSubmitOperator`.

    Everything else is SparkSubmitOperator's; ``env_vars`` you pass take precedence.

    :param pulsarstate_conn_id: the ``pulsarstate`` connection whose token to pass.
    :param pass_token: put the token into the job's environment (see above); ``False`` when the
        job gets it from a token file or the cluster.
    :raises ConfigurationError: (at run time) the token would appear on the spark-submit command line.
    """

    def __init__(
        self, *, pulsarstate_conn_id: str = PulsarStateHook.default_conn_name, pass_token: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pulsarstate_conn_id = pulsarstate_conn_id
        self.pass_token = pass_token

    def execute(self, context: Context) -> None:
        with self.lease_guard(context):
            return self._submit(context)

    def _submit(self, context: Context) -> None:
        from airflow.sdk.log import mask_secret

        env = {str(k): str(v) for k, v in (self.env_vars or {}).items()}
        config = PulsarStateHook(self.pulsarstate_conn_id).get_config()
        if config.is_single_host and not _is_local_master(self._conn_id):
            raise AirflowFailException(
                f"the pulsarstate connection {self.pulsarstate_conn_id!r} uses the embedded state log "
                f"({config.embedded_path}), a file on this host that executors of the non-local Spark master "
                f"of connection {self._conn_id!r} cannot reach (their rows would go to private files). Configure a "
                f"pulsarstate connection to a Pulsar cluster: create {self.pulsarstate_conn_id!r} (type 'pulsarstate') "
                f"or set AIRFLOW_CONN_{self.pulsarstate_conn_id.upper()}"
            )
        if lineage := self.start_lineage(config):
            record_job_arguments(lineage, config, self.application_args or [])
        token = config.auth_token
        if token:
            mask_secret(token)
            if self.pass_token:
                env.setdefault(AUTH_TOKEN_ENV, token)
        if _is_local_master(self._conn_id):
            env.setdefault("PYSPARK_PYTHON", sys.executable)
            bin_dir = os.path.dirname(sys.executable)
            path = env.get("PATH", os.environ.get("PATH", ""))
            if shutil.which("spark-submit", path=path) is None and os.path.exists(
                os.path.join(bin_dir, "spark-submit")
            ):
                env["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir
        self.env_vars = env or None
        self._hook = None  # rebuilt with the environment above
        if token:
            self._refuse_token_in_argv(token)
        return super().execute(context)

    def _refuse_token_in_argv(self, token: str) -> None:
        hook = self._get_hook()
        command = spark_submit_command(hook, self.application)
        if any(token in arg for arg in command):
            raise ConfigurationError(
                f"spark master {spark_submit_master(hook)!r} puts env_vars on the spark-submit command line "
                f"(--conf spark.yarn.appMasterEnv.* / spark.kubernetes.driverEnv.*), where the pulsarstate token of "
                f"connection {self.pulsarstate_conn_id!r} would be visible to every local user. Give the job the "
                f"token another way: a file readable by the job, named by 'token_file' in its config JSON, or "
                f"${AUTH_TOKEN_ENV} set by the cluster (e.g. spark.kubernetes.driver.secretKeyRef.{AUTH_TOKEN_ENV}); "
                f"then pass pass_token=False and keep the token out of env_vars and application_args"
            )
        # not kept: SparkSubmitOperator.execute builds the hook after it injects the OpenLineage
        # parent-job (and transport) properties into ``conf``; a hook kept here would drop them


def _is_local_master(spark_conn_id: str) -> bool:
    try:
        conn = BaseHook.get_connection(spark_conn_id)
    except AirflowNotFoundException:
        return False
    return (conn.host or "").strip().startswith("local")
