"""Operators for temp-view switching of a state table, and a task group that feeds a view from Spark.

A job that recomputes a whole table runs between two operators: :class:`CreateTempViewOperator`
opens a view, the job stages the full new table into it, and :class:`ApplyTempViewOperator`
publishes only the diff against the committed table, atomically. :func:`temp_view_spark_task_group`
wires the three, with ``spark-submit`` in the middle, and drops the view when the job fails::

    from airflow_provider_pulsarstate.operators.views import temp_view_spark_task_group

    prices = temp_view_spark_task_group(
        "prices",
        table_topic="price-table",
        application="/opt/jobs/price_table_job.py",      # stages rows with spark.write_view()
        application_args_extra=["--version", "{{ params.version }}"],
    )
    prices >> report  # runs after apply; prices.apply.output is the apply's result

Each operator is a thin layer over :class:`~airflow_provider_pulsarstate.engine.recipes.table.StateTable`,
reached through :class:`~airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, TaskGroup, TriggerRule
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pulsarstate.assets.tables import emit_apply_event, table_alias
from airflow_provider_pulsarstate.assets.uri import lineage_namespace
from airflow_provider_pulsarstate.engine.config import DEFAULT_MAX_DELETE_FRACTION
from airflow_provider_pulsarstate.engine.errors import (
    LeaseFencedError,
    UnknownScopePredicateError,
    ViewConflictError,
    ViewError,
)
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.lineage.operators import TaskLineageMixin, record_apply
from airflow_provider_pulsarstate.operators.leases import LeaseGuardMixin
from airflow_provider_pulsarstate.operators.view_job import (
    CONFIG_XCOM_KEY,
    commit_offsets_task,
    job_extra_args,
    spark_job_task,
    view_job_args,
    view_spark_submit_operator,
    xcom_of,
)
from airflow_provider_pulsarstate.operators.view_texts import default_view_id, format_counts
from airflow_provider_pulsarstate.plugins.links import PulsarStateTableLink, PulsarStateViewLink
from airflow_provider_pulsarstate.spark.views import dump_config

if TYPE_CHECKING:
    from airflow.sdk import Context

DEFAULT_CONN_ID = PulsarStateHook.default_conn_name
DEFAULT_TTL = 86400.0


# ---------------------------------------------------------------------------------- operators
class CreateTempViewOperator(TaskLineageMixin, LeaseGuardMixin, BaseOperator):
    """Open a temp view on a state table; returns ``{"view_id", "baseline", "staging_topic", "table"}``.

    The baseline is the table's commit offset when the view opened: apply refuses to overwrite
    keys changed after it (see :class:`ApplyTempViewOperator`). Creating an id that is already
    open returns that view (a retried task is safe). The connection config for a Spark job is
    pushed as JSON under the XCom key :data:`~airflow_provider_pulsarstate.operators.view_job.CONFIG_XCOM_KEY`, without the auth token. Guarded
    by a lease, it opens the view under the lease's fencing token (refused once a newer holder wrote).

    :param table_topic: the table (short name or full ``persistent://...``). Templated.
    :param scope_prefix: the view owns only keys with this prefix (others are never deleted,
        staging one is an error). Templated.
    :param scope_predicate: the name of a ``(key) -> bool`` bounding the view further, registered
        in code with :func:`~airflow_provider_pulsarstate.engine.recipes.table.register_scope_predicate`
        by a module the DAG file imports (only the name is logged; nothing is ever imported from it).
        Not templated: the scope is the DAG author's choice, never ``dag_run.conf``'s.
    :param ttl: seconds after which an unapplied view may be dropped by the next create_view.
    :param view_id: the id to use ([A-Za-z0-9_-]{1,64}); default: :func:`~airflow_provider_pulsarstate.operators.view_texts.default_view_id` of
        this task instance. Templated.
    :param pulsarstate_conn_id: the ``pulsarstate`` connection (missing default: embedded log).
    :raises AirflowFailException: ``view_id`` names a view that was already applied or dropped.
    """

    template_fields: Sequence[str] = ("table_topic", "scope_prefix", "view_id")
    operator_extra_links = (PulsarStateViewLink(), PulsarStateTableLink())
    ui_color = "#d9e7f5"

    def __init__(
        self,
        *,
        table_topic: str,
        scope_prefix: str | None = None,
        scope_predicate: str | None = None,
        ttl: float = DEFAULT_TTL,
        view_id: str | None = None,
        pulsarstate_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table_topic = table_topic
        self.scope_prefix = scope_prefix
        self.scope_predicate = scope_predicate
        self.ttl = ttl
        self.view_id = view_id
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        view_id = self.view_id or default_view_id(ti.dag_id, ti.task_id, ti.run_id, ti.try_number)
        with self.lease_guard(context) as lease, PulsarStateHook(self.pulsarstate_conn_id) as hook:
            config = hook.get_config()
            table = hook.get_table(self.table_topic)
            if lineage := self.start_lineage(config):
                lineage.reads.append(table.topic)
            info = table.create_view(
                view_id=view_id,
                scope_prefix=self.scope_prefix or None,
                scope_predicate=self.scope_predicate or None,
                ttl=self.ttl,
                **({"lease": lease} if lease is not None else {}),
            )
        if info.status != "open":
            raise AirflowFailException(
                f"view {info.view_id!r} on {info.table} is already {info.status}; use a new view id"
            )
        ti.xcom_push(key=CONFIG_XCOM_KEY, value=dump_config(config))
        self.log.info(
            "view %s open on %s (baseline offset %d, scope: %s, staging topic %s, %s back end)",
            info.view_id,
            info.table,
            info.baseline,
            info.describe_scope(),
            info.staging_topic,
            config.kind,
        )
        return {
            "view_id": info.view_id,
            "baseline": info.baseline,
            "staging_topic": info.staging_topic,
            "table": info.table,
        }


class ApplyTempViewOperator(TaskLineageMixin, LeaseGuardMixin, BaseOperator):
    """Publish a view's diff to its table (or, with ``dry_run``, only count it).

    Returns the :class:`~airflow_provider_pulsarstate.engine.recipes.table.ViewResult` as a dict
    (``view_id, set, delete, unchanged, commit_offset, already_applied``), or with ``dry_run`` the
    :class:`~airflow_provider_pulsarstate.engine.recipes.table.ViewPlan` (``view_id, set, delete,
    unchanged, sample_set, sample_delete, conflicts``), and logs a table of the counts with
    sample keys. Applying an applied view again publishes nothing and returns the original
    result, so a retried task is safe.

    :param table_topic: the table. Templated.
    :param view_id: the view, usually from the create task's XCom. Templated.
    :param dry_run: plan only: publish nothing (the view stays open unless ``drop_after_plan``);
        kept as :attr:`plan_only` (``BaseOperator.dry_run`` is a method).
    :param drop_after_plan: with ``dry_run``, drop the view after planning it (nothing else
        will apply it).
    :param overwrite: publish even where the table changed since the view's baseline.
    :param max_deletes: fail (publishing nothing) when the diff would delete more keys than this;
        guards against a job that staged too little. When given, replaces ``max_delete_fraction``.
    :param max_delete_fraction: without ``max_deletes``, fail when the diff would delete more than
        this fraction of the rows in the view's scope (default 0.5). None (and no ``max_deletes``):
        no limit.
    :param sample: sample keys to log and return per kind (from the diff apply computes anyway).
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    :param table_outlet: declare the table as an outlet (default): an apply that published
        something emits an event for the asset ``pulsar://<tenant>/<namespace>/<topic>`` whose
        extra holds ``table, view_id, commit_offset, set, delete, unchanged``; a re-apply or a dry
        run emits none (:mod:`airflow_provider_pulsarstate.assets.tables`).
    Guarded by a lease (:meth:`~airflow_provider_pulsarstate.operators.leases.LeaseTaskGroup.guard`),
    it renews the lease first and publishes under its fencing token (``lease=``): once a newer
    holder of the lease wrote to the table, the table refuses the apply and nothing is published.

    :raises AirflowFailException: a conflict (the keys are logged and in the message), an unknown,
        dropped or expired view, a staged key outside the view's scope, or a lost or fenced lease;
        retrying cannot help.
    """

    template_fields: Sequence[str] = ("table_topic", "view_id")
    operator_extra_links = (PulsarStateViewLink(), PulsarStateTableLink())
    ui_color = "#c9e4c5"

    def __init__(
        self,
        *,
        table_topic: str,
        view_id: str,
        dry_run: bool = False,
        drop_after_plan: bool = False,
        overwrite: bool = False,
        max_deletes: int | None = None,
        max_delete_fraction: float | None = DEFAULT_MAX_DELETE_FRACTION,
        sample: int = 10,
        pulsarstate_conn_id: str = DEFAULT_CONN_ID,
        table_outlet: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table_alias = (
            table_alias(self.dag.dag_id if self.has_dag() else None, self.task_id) if table_outlet else None
        )
        if self.table_alias is not None:
            self.outlets = [*self.outlets, self.table_alias]
        self.table_topic = table_topic
        self.view_id = view_id
        self.plan_only = dry_run
        self.drop_after_plan = drop_after_plan
        self.overwrite = overwrite
        self.max_deletes = max_deletes
        self.max_delete_fraction = max_delete_fraction
        self.sample = sample
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        if not self.view_id:
            raise AirflowFailException("no view id to apply (did the create task push one?)")
        with self.lease_guard(context) as lease, PulsarStateHook(self.pulsarstate_conn_id) as hook:
            table = hook.get_table(self.table_topic)
            config = hook.get_config()
            lineage = self.start_lineage(config)
            if lineage is not None:
                lineage.reads.append(table.topic)
                if not self.plan_only:
                    lineage.writes.append(table.topic)
            try:
                if self.plan_only:
                    plan = table.plan(self.view_id, sample=self.sample).as_dict()
                    title = f"dry run of view {self.view_id} on {table.topic}: nothing published"
                    if self.drop_after_plan:
                        table.drop(self.view_id)
                        title += ", view dropped"
                    self.log.info("%s", format_counts(plan, title=title))
                    return plan
                result = table.apply(
                    self.view_id,
                    overwrite=self.overwrite,
                    max_deletes=self.max_deletes,
                    max_delete_fraction=self.max_delete_fraction,
                    sample=self.sample,
                    lease=lease,
                ).as_dict()
            except LeaseFencedError as exc:
                raise AirflowFailException(
                    f"view {self.view_id} not applied to {table.topic}: {exc}. This run lost lease {exc.lease!r}; "
                    f"nothing it staged reaches the table"
                ) from exc
            except ViewConflictError as exc:
                self.log.error(
                    "%s",
                    format_counts({"conflicts": exc.keys}, title=f"view {self.view_id} conflicts on {table.topic}"),
                )
                raise AirflowFailException(
                    f"{exc} -- re-run with overwrite=True to publish anyway, or recompute the view"
                ) from exc
            except (
                ViewError,
                UnknownScopePredicateError,
            ) as exc:  # not found, closed, scope, guard, unsealed, bad rows
                raise AirflowFailException(str(exc)) from exc
            if lineage is not None:
                record_apply(lineage, table, result)
        title = f"view {self.view_id} applied to {table.topic} at offset {result['commit_offset']}"
        if result["already_applied"]:
            title = f"{title} earlier: nothing new published"
        self.log.info("%s", format_counts(result, title=title))
        if self.table_alias is not None:
            emit_apply_event(
                context, self.table_alias, table=table.topic, result=result, lineage_namespace=lineage_namespace(config)
            )
        return result


class DropTempViewOperator(BaseOperator):
    """Drop (abort) an open view and delete its staged rows; returns ``{"view_id", "dropped"}``.

    Dropping a view that is not open (applied, already dropped, never created) changes nothing
    and returns ``dropped=False``; an empty ``view_id`` (the create task never ran) is a no-op.

    :param table_topic: the table. Templated.
    :param view_id: the view. Templated.
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    """

    template_fields: Sequence[str] = ("table_topic", "view_id")
    operator_extra_links = (PulsarStateViewLink(), PulsarStateTableLink())
    ui_color = "#f5d9d9"

    def __init__(
        self,
        *,
        table_topic: str,
        view_id: str | None,
        pulsarstate_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table_topic = table_topic
        self.view_id = view_id
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        if not self.view_id:
            self.log.info("no view id (the create task did not run): nothing to drop")
            return {"view_id": None, "dropped": False}
        with PulsarStateHook(self.pulsarstate_conn_id) as hook:
            table = hook.get_table(self.table_topic)
            dropped = table.drop(self.view_id)
            info = table.view_info(self.view_id)
        if dropped:
            self.log.info("view %s on %s dropped; its staged rows are deleted", self.view_id, table.topic)
        else:
            status = info.status if info else "unknown"
            self.log.info("view %s on %s is %s: nothing to drop", self.view_id, table.topic, status)
        return {"view_id": self.view_id, "dropped": dropped}


# ---------------------------------------------------------------------------------- Spark task group
class TempViewTaskGroup(TaskGroup):
    """The task group :func:`temp_view_spark_task_group` returns.

    ``create``, ``spark``, ``apply`` and ``drop`` are its tasks, plus ``commit`` (the cursor
    commit after apply) in an ingestion group. Its only leaf for downstream dependencies is
    ``commit`` when there is one, else ``apply`` (``group >> report`` runs ``report`` after a
    successful apply), although ``drop`` has no downstream task either: it is skipped when the
    job succeeds.

    The Spark application gets, before ``application_args_extra``::

        --view-id <id> --table-topic <full topic> --config-json <ConnectionConfig as JSON>

    all rendered from the create task's XCom (the config as the hook resolved it, with an
    absolute embedded path and without the auth token, which the job finds in
    ``$PULSARSTATE_AUTH_TOKEN``). A job stages its rows with
    :func:`airflow_provider_pulsarstate.spark.write_view`.

    ``drop`` runs only when ``spark`` fails (trigger rule ``one_failed``) and drops the
    half-staged view; the table is untouched. A failed ``apply`` keeps its view open on
    purpose: apply is idempotent and resumable (clear the task to finish a crashed apply, or to
    apply a conflicting one with ``overwrite``), and an abandoned view expires after ``ttl``.
    Since ``apply`` stays a leaf of the DAG, a failure of the job or the apply fails the
    run even when the group ends the DAG. With ``dry_run`` the apply task plans the view, then
    drops it.

    Retries of ``spark`` stage into the same open view (a deterministic job stages the same
    rows again, which changes nothing). After a final failure the view is dropped: re-run by
    clearing the group from ``create``, whose new attempt opens a new view.
    """

    create: CreateTempViewOperator
    spark: BaseOperator
    apply: ApplyTempViewOperator
    drop: DropTempViewOperator
    commit: BaseOperator | None = None

    def get_leaves(self) -> Any:
        last = self.commit or getattr(self, "apply", None)
        if last is None:
            yield from super().get_leaves()
            return
        yield last


def temp_view_spark_task_group(
    group_id: str,
    *,
    table_topic: str,
    application: str,
    application_args_extra: Iterable[Any] = (),
    spark_conn_id: str = "spark_default",
    pulsarstate_conn_id: str = DEFAULT_CONN_ID,
    scope_prefix: str | None = None,
    scope_predicate: str | None = None,
    ttl: float = DEFAULT_TTL,
    view_id: str | None = None,
    dry_run: bool = False,
    overwrite: bool = False,
    max_deletes: int | None = None,
    max_delete_fraction: float | None = DEFAULT_MAX_DELETE_FRACTION,
    sample: int = 10,
    source_topic: str | None = None,
    source_subscription: str | None = None,
    **spark_kwargs: Any,
) -> TempViewTaskGroup:
    """create_view -> spark_job -> apply_view, plus drop_view when the job fails (see :class:`TempViewTaskGroup`).

    :param group_id: the task group's id.
    :param table_topic: the table. Templated (e.g. ``"{{ params.table }}"``).
    :param application: the job script or jar for ``spark-submit``.
    :param application_args_extra: more arguments for the job; each becomes a str (templates
        such as ``"{{ params.version }}"`` are rendered).
    :param spark_conn_id: the Spark connection (e.g. ``{"conn_type": "spark", "host": "local[*]"}``).
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    :param scope_prefix, scope_predicate, ttl, view_id: see :class:`CreateTempViewOperator`.
    :param dry_run, overwrite, max_deletes, max_delete_fraction, sample: see :class:`ApplyTempViewOperator`.
    :param source_topic: exactly-once ingestion: the topic the job consumes, passed to it as
        ``--source-topic <name>`` (templated; short names use the connection's namespace). The job
        reads from the table's recorded offsets and seals its view with the range it read
        (:mod:`airflow_provider_pulsarstate.spark.offsets`); apply publishes the range with the diff.
    :param source_subscription: with ``source_topic``: after the apply, a ``commit_offsets`` task
        (:class:`~airflow_provider_pulsarstate.operators.offsets.CommitSourceOffsetsOperator`)
        moves this subscription's cursor to the table's record. Runs read the record, never the
        cursor, so a run killed between apply and commit loses and repeats nothing.
    :param spark_kwargs: more SparkSubmitOperator arguments (``conf``, ``env_vars``, ``name``, ...).
    :return: the group; ``group.create``, ``.spark``, ``.apply``, ``.drop`` are its tasks.
    :raises MissingExtraError: the ``[spark]`` extra (the Spark provider) is not installed.
    """
    extra = job_extra_args(application_args_extra, source_topic, source_subscription, spark_kwargs)
    submit_operator = view_spark_submit_operator()
    group = TempViewTaskGroup(group_id=group_id)
    with group:
        create = _create_task(table_topic, pulsarstate_conn_id, scope_prefix, scope_predicate, ttl, view_id)
        job_args = [*view_job_args(create.task_id), *extra]
        spark = spark_job_task(submit_operator, application, job_args, spark_conn_id, pulsarstate_conn_id, spark_kwargs)
        apply = _apply_task(
            create, table_topic, pulsarstate_conn_id, dry_run, overwrite, max_deletes, max_delete_fraction, sample
        )
        drop = _drop_task(create.task_id, table_topic, pulsarstate_conn_id)
        create >> spark >> [apply, drop]
        group.commit = commit_offsets_task(apply, table_topic, source_topic, source_subscription, pulsarstate_conn_id)
    group.create, group.spark, group.apply, group.drop = create, spark, apply, drop
    return group


def _create_task(
    table_topic: str,
    pulsarstate_conn_id: str,
    scope_prefix: str | None,
    scope_predicate: str | None,
    ttl: float,
    view_id: str | None,
) -> CreateTempViewOperator:
    """Opens the view."""
    return CreateTempViewOperator(
        task_id="create_view",
        table_topic=table_topic,
        scope_prefix=scope_prefix,
        scope_predicate=scope_predicate,
        ttl=ttl,
        view_id=view_id,
        pulsarstate_conn_id=pulsarstate_conn_id,
    )


def _apply_task(
    create: CreateTempViewOperator,
    table_topic: str,
    pulsarstate_conn_id: str,
    dry_run: bool,
    overwrite: bool,
    max_deletes: int | None,
    max_delete_fraction: float | None,
    sample: int,
) -> ApplyTempViewOperator:
    """Applies the view the create task opened (with ``dry_run``: plans it, then drops it)."""
    return ApplyTempViewOperator(
        task_id="apply_view",
        table_topic=table_topic,
        view_id="{{ %s['view_id'] }}" % xcom_of(create.task_id),
        dry_run=dry_run,
        drop_after_plan=dry_run,
        overwrite=overwrite,
        max_deletes=max_deletes,
        max_delete_fraction=max_delete_fraction,
        sample=sample,
        pulsarstate_conn_id=pulsarstate_conn_id,
    )


def _drop_task(create_task_id: str, table_topic: str, pulsarstate_conn_id: str) -> DropTempViewOperator:
    """Drops the view when the Spark job fails (an empty view id when the create task did not run)."""
    return DropTempViewOperator(
        task_id="drop_view",
        table_topic=table_topic,
        view_id="{{ (%s or {}).get('view_id') or '' }}" % xcom_of(create_task_id),
        pulsarstate_conn_id=pulsarstate_conn_id,
        trigger_rule=TriggerRule.ONE_FAILED,
    )
