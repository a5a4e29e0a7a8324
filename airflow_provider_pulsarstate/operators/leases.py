"""Leases across the tasks of a DAG: acquire, guard the tasks in between, release whatever happened.

A :class:`~airflow_provider_pulsarstate.engine.recipes.lease.Lease` outlives the task that won it:
its handle travels to the guarded tasks as XCom. :func:`lease_task_group` wires it::

    from airflow_provider_pulsarstate.operators.leases import lease_task_group

    lease = lease_task_group("lease", lease_name="price-ingest", ttl=60, timeout=900)
    prices = temp_view_spark_task_group("prices", ...)
    lease.guard(prices)        # acquire >> prices >> release; its Spark job and writes run under the lease

* ``acquire`` (:class:`AcquireLeaseOperator`) waits up to ``timeout`` for the lease and returns its
  handle (``Lease.to_json()``) as XCom;
* each guarded task (an operator with :class:`LeaseGuardMixin`: our view and offset operators,
  :class:`~airflow_provider_pulsarstate.operators.spark_submit.GuardedSparkSubmitOperator`) renews
  the lease when it starts, which re-validates the handle against the lease log, and every
  ``ttl / 3`` seconds in a daemon thread while it runs; the writes it makes to state carry the
  lease (``lease=``), so a state log refuses them once a newer holder wrote;
* ``release`` (:class:`ReleaseLeaseOperator`) is the group's teardown: it runs whatever happened
  to the guarded tasks and gives the lease up if this run still holds it.

A guarded task that finds the lease lost (taken over, released, or not renewed before it expired)
fails with :class:`AirflowFailException` naming the lease, its token and the new holder; when the
loss is found while it runs, the task is stopped through its ``on_kill`` (a Spark job is killed)
and fails when its ``execute`` returns. Retrying it cannot help: clear the group from ``acquire``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, TaskGroup, TriggerRule
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_pulsarstate.engine.errors import ConfigurationError, LeaseLostError, LeaseTimeoutError
from airflow_provider_pulsarstate.hooks.pulsarstate import LeaseKeeper, PulsarStateHook
from airflow_provider_pulsarstate.plugins.links import PulsarStateLeaseLink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_pulsarstate.hooks.pulsarstate import Lease, Leases

    # What the mixin is mixed into: an operator (its execute, on_kill, >>).
    _GuardedOperator = BaseOperator
else:
    _GuardedOperator = object

DEFAULT_CONN_ID = PulsarStateHook.default_conn_name
DEFAULT_HOLDER = "{{ dag.dag_id }}/{{ run_id }}"
"""The holder an :class:`AcquireLeaseOperator` names by default: the DAG and the run."""


def describe_loss(lease: Lease, err: LeaseLostError) -> str:
    """Why ``lease`` is no longer held, naming the lease, its token and the new holder."""
    current = err.current
    holder = getattr(current, "holder", None)
    if holder is not None:
        now = f"it is now held by {holder!r} under token {getattr(current, 'token', '?')}"
    elif current is not None:
        now = f"it was released (last token {getattr(current, 'token', '?')})"
    else:
        now = "the lease log has no such lease"
    return (
        f"lease {lease.name!r} (token {lease.token}, holder {lease.holder!r}, log {lease.topic}) is no longer held "
        f"by this run: {now} ({err}). This task stops instead of acting without the lease; re-run the lease "
        f"group from its acquire task"
    )


# ---------------------------------------------------------------------------------- acquire / release
class AcquireLeaseOperator(BaseOperator):
    """Wait until this run wins a lease; returns its handle (``Lease.to_json()``) as XCom.

    The fencing token in the handle is durable in the lease log before the task succeeds.

    :param lease_name: the lease (unique within its lease log). Templated.
    :param holder: who holds it: names the deployment and the run. Templated; default
        ``"{{ dag.dag_id }}/{{ run_id }}"``.
    :param ttl: seconds the lease stays valid after each acquire or renew (guarded tasks renew it
        every ``ttl / 3``). Templated (e.g. ``"{{ params.lease_ttl }}"``).
    :param timeout: seconds to wait for the lease (0: one attempt; None: as long as it takes).
        Templated (e.g. ``"{{ params.lease_timeout }}"``).
    :param lease_topic: the lease log (short or full name; default ``pulsarstate-leases``). Templated.
    :param steal: take the lease over even though its holder's lease is still valid.
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    :raises AirflowException: still held by another holder after ``timeout`` (retryable: a later
        try may win it).
    :raises AirflowFailException: a bad lease name, holder or ttl.
    """

    template_fields: Sequence[str] = ("lease_name", "holder", "lease_topic", "ttl", "timeout")
    operator_extra_links = (PulsarStateLeaseLink(),)
    ui_color = "#f3e6c4"

    def __init__(
        self,
        *,
        lease_name: str,
        ttl: float | str,
        timeout: float | str | None = None,
        holder: str = DEFAULT_HOLDER,
        lease_topic: str | None = None,
        steal: bool = False,
        pulsarstate_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.lease_name = lease_name
        self.ttl = ttl
        self.timeout = timeout
        self.holder = holder
        self.lease_topic = lease_topic
        self.steal = steal
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def _seconds(self, field: str, value: float | str) -> float:
        """A rendered ``ttl`` or ``timeout`` as seconds."""
        try:
            return float(value)
        except (TypeError, ValueError):
            raise AirflowFailException(f"lease {self.lease_name!r}: {field} must be seconds, got {value!r}") from None

    def execute(self, context: Context) -> dict[str, Any]:
        ttl = self._seconds("ttl", self.ttl)
        raw = self.timeout
        if raw is None or (isinstance(raw, str) and raw.strip() in ("", "None")):
            timeout = None  # wait as long as it takes
        else:
            timeout = self._seconds("timeout", raw)
        with PulsarStateHook(self.pulsarstate_conn_id) as hook:
            leases = hook.get_leases(self.lease_topic or None)
            self.log.info(
                "acquiring lease %r for %r (ttl %ss, timeout %s, steal=%s)",
                self.lease_name,
                self.holder,
                ttl,
                timeout,
                self.steal,
            )
            try:
                lease = leases.acquire(self.lease_name, self.holder, ttl=ttl, timeout=timeout, steal=self.steal)
            except LeaseTimeoutError as exc:
                current = exc.current
                raise AirflowException(
                    f"lease {self.lease_name!r} is still held by {getattr(current, 'holder', None)!r} "
                    f"(token {getattr(current, 'token', '?')}) after waiting {timeout}s: {exc}"
                ) from exc
            except ConfigurationError as exc:
                raise AirflowFailException(f"cannot acquire lease {self.lease_name!r}: {exc}") from exc
        self.log.info(
            "lease %r acquired by %r with fencing token %d (log %s)", lease.name, lease.holder, lease.token, lease.topic
        )
        return lease.to_json()


class ReleaseLeaseOperator(BaseOperator):
    """Give up the lease the acquire task won, if this run still holds it; idempotent.

    Runs whatever happened upstream (trigger rule ``all_done`` by default). Returns
    ``{"name", "token", "released"}``; ``released`` is False when the lease was already released,
    taken over (nothing is changed then), or never acquired (no handle in XCom).

    :param lease_task_id: the task whose XCom return value is the handle (the acquire task).
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    """

    template_fields: Sequence[str] = ("lease_task_id",)
    operator_extra_links = (PulsarStateLeaseLink(),)
    ui_color = "#f3e6c4"

    def __init__(
        self,
        *,
        lease_task_id: str,
        pulsarstate_conn_id: str = DEFAULT_CONN_ID,
        trigger_rule: str = TriggerRule.ALL_DONE,
        **kwargs: Any,
    ) -> None:
        super().__init__(trigger_rule=trigger_rule, **kwargs)
        self.lease_task_id = lease_task_id
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        handle = context["ti"].xcom_pull(task_ids=self.lease_task_id)
        if handle is None:
            self.log.info("task %s pushed no lease handle (it did not win one): nothing to release", self.lease_task_id)
            return {"name": None, "token": None, "released": False}
        with PulsarStateHook(self.pulsarstate_conn_id) as hook:
            lease = _parse(hook, handle, self.lease_task_id)
            released = hook.get_leases(lease.topic).release(lease)
        if released:
            self.log.info("lease %r (token %d, holder %r) released", lease.name, lease.token, lease.holder)
        else:
            self.log.info(
                "lease %r (token %d, holder %r) was not held under that token any more (released earlier or "
                "taken over): nothing released",
                lease.name,
                lease.token,
                lease.holder,
            )
        return {"name": lease.name, "token": lease.token, "released": released}


def _parse(hook: PulsarStateHook, handle: Any, task_id: str) -> Lease:
    try:
        return hook.lease_from_json(handle)
    except ConfigurationError as exc:
        raise AirflowFailException(f"the XCom of task {task_id} is not a lease handle: {exc}") from exc


# ---------------------------------------------------------------------------------- renewal
class LeaseRenewer(LeaseKeeper):
    """A :class:`~airflow_provider_pulsarstate.engine.recipes.lease.LeaseKeeper` for a task: renews
    the lease every ``interval`` seconds (default ``ttl / 3``) and calls ``on_lost`` once the lease
    is taken over, released, or not renewed before it expired as this process counts it, at the
    latest at that expiry even while a renew call is blocked (:attr:`lost` holds the error).

    :param leases: the recipe the lease lives in.
    :param lease: the (already renewed) lease.
    :param interval: seconds between renewals (default ``ttl / 3``).
    :param on_lost: called once with the loss.
    :param log: where renewals and failures are logged.
    """

    def __init__(
        self,
        leases: Leases,
        lease: Lease,
        *,
        interval: float | None = None,
        on_lost: Callable[[LeaseLostError], None] | None = None,
        log: Any = None,
    ) -> None:
        super().__init__(leases, lease, interval=interval, on_lost=on_lost, log=log)

    def check(self) -> None:
        """:raises AirflowFailException: the lease was lost (names lease, token and new holder)."""
        if self.lost is not None:
            raise AirflowFailException(describe_loss(self.lease, self.lost)) from self.lost


@contextmanager
def hold_lease(
    context: Context,
    *,
    lease_task_id: str,
    pulsarstate_conn_id: str = DEFAULT_CONN_ID,
    renew_interval: float | None = None,
    on_lost: Callable[[LeaseLostError], None] | None = None,
    log: Any = None,
) -> Iterator[LeaseRenewer]:
    """Hold the lease the task ``lease_task_id`` acquired while the body runs (any task, e.g. ``@task``).

    Renews it first (re-validating the handle from XCom against the lease log), then in the
    background every ``renew_interval`` (default ``ttl / 3``). Yields the :class:`LeaseRenewer`:
    pass ``renewer.lease`` to guarded writes (``lease=``) and call ``renewer.check()`` between
    steps. On exit, raises if the lease was lost meanwhile, even when the body succeeded.

    :raises AirflowFailException: no handle in XCom, a malformed handle, or the lease is lost.
    """
    ti = context["ti"]
    handle = ti.xcom_pull(task_ids=lease_task_id)
    if handle is None:
        raise AirflowFailException(
            f"task {ti.task_id} is guarded by the lease of task {lease_task_id}, which pushed no lease handle "
            f"(it did not run, or did not win the lease)"
        )
    with PulsarStateHook(pulsarstate_conn_id) as hook:
        lease = _parse(hook, handle, lease_task_id)
        leases = hook.get_leases(lease.topic)
        try:
            lease = leases.renew(lease)
        except LeaseLostError as exc:
            raise AirflowFailException(describe_loss(lease, exc)) from exc
        if log is not None:
            log.info(
                "holding lease %r (token %d, holder %r); renewing every %.1fs",
                lease.name,
                lease.token,
                lease.holder,
                renew_interval or lease.ttl / 3.0,
            )
        renewer = LeaseRenewer(leases, lease, interval=renew_interval, on_lost=on_lost, log=log)
        renewer.start()
        try:
            yield renewer
        except BaseException:
            renewer.stop()
            renewer.check()  # a failure caused by losing the lease is reported as that
            raise
        renewer.stop()
        renewer.check()


class LeaseGuardMixin(_GuardedOperator):
    """Makes an operator a guarded task: it runs only while its DAG run holds a lease.

    Mix in before the operator class (``class MyOp(LeaseGuardMixin, SomeOperator)``). With
    ``lease_task_id`` set (:meth:`LeaseTaskGroup.guard` sets it), ``execute`` runs inside
    :func:`hold_lease`: the lease is renewed on start and in the background, :attr:`lease` is the
    current :class:`Lease` for the operator's writes (``lease=self.lease``), and a loss found while
    it runs calls :meth:`on_lease_lost` (default: ``self.on_kill()``, which kills a Spark job) and
    fails the task. Without ``lease_task_id`` the operator runs unguarded.

    Operators that override ``execute`` themselves wrap their body in ``with self.lease_guard(context):``.
    The mixin adds no constructor argument (Airflow wraps every operator ``__init__``): set the
    attributes ``lease_task_id`` and ``lease_renew_interval`` on the instance, or let
    :meth:`LeaseTaskGroup.guard` set them.
    """

    #: the acquire task whose XCom is the lease handle (set by :meth:`LeaseTaskGroup.guard`); None: unguarded
    lease_task_id: str | None = None
    #: seconds between background renewals (None: ``ttl / 3``)
    lease_renew_interval: float | None = None
    _lease_renewer: LeaseRenewer | None = None

    @property
    def lease(self) -> Lease | None:
        """The lease this task holds while its guard is active (None: unguarded or not running)."""
        renewer = getattr(self, "_lease_renewer", None)
        return renewer.lease if renewer is not None else None

    @contextmanager
    def lease_guard(self, context: Context) -> Iterator[Lease | None]:
        """Hold the lease while the body runs (a no-op without ``lease_task_id``); yields the lease."""
        if not self.lease_task_id:
            yield None
            return
        with hold_lease(
            context,
            lease_task_id=self.lease_task_id,
            pulsarstate_conn_id=getattr(self, "pulsarstate_conn_id", DEFAULT_CONN_ID),
            renew_interval=self.lease_renew_interval,
            on_lost=self.on_lease_lost,
            log=getattr(self, "log", None),
        ) as renewer:
            self._lease_renewer = renewer
            try:
                yield renewer.lease
            finally:
                self._lease_renewer = None

    def on_lease_lost(self, error: LeaseLostError) -> None:
        """Called from the renewal thread when the lease is lost while the task runs: stop the work."""
        self.on_kill()

    def execute(self, context: Context) -> Any:
        with self.lease_guard(context):
            return super().execute(context)


# ---------------------------------------------------------------------------------- task group
class LeaseTaskGroup(TaskGroup):
    """The group :func:`lease_task_group` returns: ``acquire`` and ``release`` (its teardown).

    :meth:`guard` puts tasks or task groups under the lease. Iterating over
    ``(group.acquire, group.release)`` is spelled ``acquire, release = group.tasks_pair``.
    """

    acquire: AcquireLeaseOperator
    release: ReleaseLeaseOperator

    @property
    def lease_task_id(self) -> str:
        """The acquire task's id: what guarded tasks pull the handle from."""
        return self.acquire.task_id

    @property
    def tasks_pair(self) -> tuple[AcquireLeaseOperator, ReleaseLeaseOperator]:
        return self.acquire, self.release

    def guard(self, *items: Any) -> LeaseTaskGroup:
        """Run ``items`` (operators or task groups) under the lease.

        Every task with :class:`LeaseGuardMixin` among them (inside groups too) becomes guarded;
        ``acquire`` runs before them and ``release`` after all of them. An operator without the
        mixin is a TypeError (subclass it with the mixin, or use :func:`hold_lease` in a ``@task``);
        inside a group, tasks without it (e.g. ``drop_view``) run unguarded.

        :returns: this group (``lease.guard(a).guard(b)``).
        """
        for item in items:
            guarded: list[LeaseGuardMixin]
            if isinstance(item, TaskGroup):
                guarded = [task for task in item.iter_tasks() if isinstance(task, LeaseGuardMixin)]
                if not guarded:
                    raise TypeError(f"task group {item.group_id!r} has no task that can hold a lease (LeaseGuardMixin)")
            elif isinstance(item, LeaseGuardMixin):
                guarded = [item]
            else:
                raise TypeError(
                    f"task {getattr(item, 'task_id', item)!r} ({type(item).__name__}) cannot hold a lease: "
                    f"subclass it with LeaseGuardMixin, or use hold_lease() inside a @task"
                )
            for task in guarded:
                task.lease_task_id = self.lease_task_id
            self.acquire >> item
            item >> self.release
            for task in guarded:
                if self.release.task_id not in task.downstream_task_ids:
                    task >> self.release
        return self


def lease_task_group(
    group_id: str,
    *,
    lease_name: str,
    ttl: float | str,
    timeout: float | str | None = None,
    holder: str = DEFAULT_HOLDER,
    lease_topic: str | None = None,
    steal: bool = False,
    pulsarstate_conn_id: str = DEFAULT_CONN_ID,
    guard: Iterable[Any] = (),
) -> LeaseTaskGroup:
    """A group of ``acquire`` (:class:`AcquireLeaseOperator`) and ``release`` (:class:`ReleaseLeaseOperator`).

    ``release`` is marked as the teardown of ``acquire`` (Airflow setup/teardown): it runs when the
    guarded tasks are done, whatever their outcome, as long as ``acquire`` won the lease (trigger
    rule ``all_done_setup_success``; nothing to release otherwise), and its own success does not
    hide a failed guarded task from the DAG run's state. Clearing a guarded task clears both, so a
    re-run acquires the lease again.

    :param group_id: the group's id (tasks ``<group_id>.acquire`` and ``<group_id>.release``).
    :param lease_name, ttl, timeout, holder, lease_topic, steal, pulsarstate_conn_id: see
        :class:`AcquireLeaseOperator`.
    :param guard: tasks or groups to guard now (same as calling :meth:`LeaseTaskGroup.guard`).
    """
    group = LeaseTaskGroup(group_id=group_id)
    with group:
        acquire = AcquireLeaseOperator(
            task_id="acquire",
            lease_name=lease_name,
            ttl=ttl,
            timeout=timeout,
            holder=holder,
            lease_topic=lease_topic,
            steal=steal,
            pulsarstate_conn_id=pulsarstate_conn_id,
        )
        release = ReleaseLeaseOperator(
            task_id="release", lease_task_id=acquire.task_id, pulsarstate_conn_id=pulsarstate_conn_id
        )
        release.as_teardown(setups=acquire)
    group.acquire, group.release = acquire, release
    items = list(guard)
    if items:
        group.guard(*items)
    return group
