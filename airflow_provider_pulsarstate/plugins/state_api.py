"""The read-only REST API behind the "Pulsar State" page, mounted on the API server at :data:`URL_PREFIX`.

Every route is a GET, answers JSON (the page itself excepted) and sits behind Airflow's
authentication and authorization: reading a connection's state needs the right to read that
connection (``requires_access_connection("GET")``, e.g. the Op role of the simple auth manager),
which Airflow checks from the bearer token or the UI's ``_token`` cookie (so the page works inside
the UI's iframe). Connections are resolved as Airflow's server processes resolve them (metadata
DB, secrets backends, environment); a connection that is not defined is a 404 naming it, never
the embedded log. Bad input is a 400 whose ``detail`` starts with the field at fault
(``topic: ...``, ``prefix: ...``, ``cursor: ...``, ``limit: ...``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ConfigurationError,
    OperationTimeoutError,
    PulsarStateError,
)
from airflow_provider_pulsarstate.hooks.airflow_internals import server_context
from airflow_provider_pulsarstate.plugins import maps_reader, state_reader
from airflow_provider_pulsarstate.plugins.state_reader import MAX_PAGE_ROWS, MAX_TRANSITIONS, TopicMissingError

URL_PREFIX = "/pulsarstate"
"""Where the API server mounts this app (``/pulsarstate/api/...``, the page at ``/pulsarstate/``)."""

MAX_PREFIX_CHARS = 512
MAX_CURSOR_CHARS = 1024
MAX_TOPIC_CHARS = 512
MAX_ID_CHARS = 250  # Airflow's own bound on dag, run and task ids (the dag_run columns)
MAX_ASSET_NAME_CHARS = 1500
MAX_RUNS = 100


def _xcom_access() -> Any:
    """Reading the XComs of the DAG named by the ``dag_id`` path parameter
    (``is_authorized_dag`` with ``DagAccessEntity.XCOM``), as Airflow's own XCom routes check it."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return Depends(requires_access_dag("GET", DagAccessEntity.XCOM))


def _asset_access() -> Any:
    from airflow.api_fastapi.core_api.security import requires_access_asset

    return Depends(requires_access_asset("GET"))


def _connection_access() -> Any:
    from airflow.api_fastapi.core_api.security import requires_access_connection

    return Depends(requires_access_connection("GET"))


def _authenticated() -> Any:
    from airflow.api_fastapi.core_api.security import requires_authenticated

    return Depends(requires_authenticated())


def _bad(field: str, problem: str) -> HTTPException:
    return HTTPException(status_code=400, detail=f"{field}: {problem}")


def _check_text(field: str, value: str | None, limit: int) -> None:
    if value is None:
        return
    if len(value) > limit:
        raise _bad(field, f"longer than {limit} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise _bad(field, "contains control characters")


@contextlib.contextmanager
def _hook(connection_id: str, *, field: str = "topic") -> Iterator[Any]:
    """The connection's hook, with engine errors turned into HTTP answers (``field``: what a
    ConfigurationError is about)."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    with server_context():
        try:
            PulsarStateHook.get_connection(connection_id)
        except AirflowNotFoundException:
            raise HTTPException(status_code=404, detail=f"connection: {connection_id!r} is not defined") from None
        hook = PulsarStateHook(connection_id)
        try:
            yield hook
        except TopicMissingError as exc:
            raise HTTPException(status_code=404, detail=f"topic: {exc}") from exc
        except ConfigurationError as exc:
            raise _bad(field, str(exc)) from exc
        except (BackendUnavailableError, OperationTimeoutError) as exc:
            raise HTTPException(status_code=503, detail=f"back end: {exc}") from exc
        except PulsarStateError as exc:
            raise HTTPException(status_code=500, detail=f"{type(exc).__name__}: {exc}") from exc
        finally:
            hook.close()


def _id(field: str, value: str, limit: int = MAX_ID_CHARS) -> str:
    _check_text(field, value, limit)
    if not value.strip():
        raise _bad(field, "must not be empty")
    return value


def _store(store: str) -> str:
    if store not in maps_reader.STORES:
        raise _bad("store", f"must be one of {', '.join(maps_reader.STORES)}, got {store[:40]!r}")
    return store


def _page_args(cursor: str | None, limit: int) -> None:
    _check_text("cursor", cursor, MAX_CURSOR_CHARS)
    if not 1 <= limit <= MAX_PAGE_ROWS:
        raise _bad("limit", f"must be between 1 and {MAX_PAGE_ROWS}, got {limit}")


def _topic(topic: str) -> str:
    _check_text("topic", topic, MAX_TOPIC_CHARS)
    if not topic.strip():
        raise _bad("topic", "must not be empty")
    return topic


def create_app() -> FastAPI:
    """The FastAPI app (no I/O here; the routes open connections per request)."""
    app = FastAPI(
        title="Pulsar State",
        description="Read-only view of the provider's shared state.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    access = [_connection_access()]
    base = "/api/connections/{connection_id}"
    _add_page_routes(app)
    _add_table_routes(app, base, access)
    _add_lease_routes(app, base, access)
    maps = base + "/maps"
    _add_run_map_routes(app, maps, access)
    _add_asset_map_routes(app, maps, access)
    _add_subscription_routes(app, base, access)
    return app


def _add_page_routes(app: FastAPI) -> None:
    """The page itself and its icon."""

    @app.get("/", response_class=HTMLResponse, dependencies=[_authenticated()], include_in_schema=False)
    def page() -> HTMLResponse:
        html = resources.files("airflow_provider_pulsarstate.plugins").joinpath("pulsar_state.html").read_text("utf-8")
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    @app.get("/icon.svg", include_in_schema=False)
    def icon() -> Response:
        svg = resources.files("airflow_provider_pulsarstate.plugins").joinpath("icon.svg").read_bytes()
        return Response(svg, media_type="image/svg+xml")


def _add_table_routes(app: FastAPI, base: str, access: list[Any]) -> None:
    """Topics of the namespace, and a table's summary, rows and views."""

    @app.get(base + "/topics", dependencies=access)
    def topics(connection_id: str, prefix: str = Query("", max_length=MAX_PREFIX_CHARS)) -> dict[str, Any]:
        """The topics of the connection's namespace whose short name starts with ``prefix``."""
        _check_text("prefix", prefix, MAX_PREFIX_CHARS)
        if "/" in prefix:
            raise _bad("prefix", "a short-name prefix has no '/'")
        with _hook(connection_id, field="prefix") as hook:
            return state_reader.list_topics(hook, prefix=prefix)

    @app.get(base + "/table", dependencies=access)
    def table(connection_id: str, topic: str) -> dict[str, Any]:
        """A table's summary: rows, log length, last commit, checkpoint, writer."""
        with _hook(connection_id) as hook:
            return state_reader.table_summary(hook, _topic(topic))

    @app.get(base + "/table/rows", dependencies=access)
    def rows(
        connection_id: str,
        topic: str,
        prefix: str = "",
        cursor: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """One page of rows whose key starts with ``prefix``, after ``cursor`` (at most ``limit``)."""
        _check_text("prefix", prefix, MAX_PREFIX_CHARS)
        _check_text("cursor", cursor, MAX_CURSOR_CHARS)
        if cursor is not None and not cursor.startswith(prefix):
            raise _bad("cursor", "is not a key under the prefix (use next_cursor of the previous page)")
        if not 1 <= limit <= MAX_PAGE_ROWS:
            raise _bad("limit", f"must be between 1 and {MAX_PAGE_ROWS}, got {limit}")
        with _hook(connection_id) as hook:
            return state_reader.table_rows(hook, _topic(topic), prefix=prefix, cursor=cursor, limit=limit)

    @app.get(base + "/table/views", dependencies=access)
    def views(connection_id: str, topic: str) -> dict[str, Any]:
        """The table's views; open sealed ones with their plan (nothing is published)."""
        with _hook(connection_id) as hook:
            return state_reader.table_views(hook, _topic(topic))


def _add_lease_routes(app: FastAPI, base: str, access: list[Any]) -> None:
    """Leases, their holder changes, and the exclusive producers (leadership) of a topic."""

    @app.get(base + "/leases", dependencies=access)
    def leases(connection_id: str, topic: str | None = None) -> dict[str, Any]:
        """Every lease of the lease log ``topic`` (default: the provider's lease log)."""
        with _hook(connection_id) as hook:
            return state_reader.leases(hook, _topic(topic) if topic is not None else None)

    @app.get(base + "/leases/transitions", dependencies=access)
    def lease_transitions(
        connection_id: str, topic: str | None = None, name: str | None = None, limit: int = 100
    ) -> dict[str, Any]:
        """Recent holder changes of the lease log ``topic`` (of lease ``name``, or all), newest first."""
        if name is not None:
            _id("name", name, MAX_TOPIC_CHARS)
        if not 1 <= limit <= MAX_TRANSITIONS:
            raise _bad("limit", f"must be between 1 and {MAX_TRANSITIONS}, got {limit}")
        with _hook(connection_id) as hook:
            return state_reader.lease_transitions(
                hook, _topic(topic) if topic is not None else None, name=name, limit=limit
            )

    @app.get(base + "/leadership", dependencies=access)
    def leadership(connection_id: str, topic: str) -> dict[str, Any]:
        """The exclusive producer (held, name, epoch) of each partition of ``topic``."""
        with _hook(connection_id) as hook:
            return state_reader.leadership(hook, _topic(topic))


def _add_run_map_routes(app: FastAPI, maps: str, access: list[Any]) -> None:
    """The XCom and task-state maps of a DAG's runs (values only with the right to read XComs)."""
    xcom_access = [*access, _xcom_access()]

    @app.get(maps + "/dags/{dag_id}/runs", dependencies=access)
    def dag_runs(connection_id: str, dag_id: str, limit: int = 25, cursor: int | None = None) -> dict[str, Any]:
        """The DAG's newest runs (metadata DB) with entries and bytes of their XCom and task-state maps;
        ``cursor``: the ``next_cursor`` of the previous page. No values."""
        from airflow_provider_pulsarstate.xcom.metadata_db import recent_runs

        _id("dag_id", dag_id)
        if not 1 <= limit <= MAX_RUNS:
            raise _bad("limit", f"must be between 1 and {MAX_RUNS}, got {limit}")
        if cursor is not None and cursor < 1:
            raise _bad("cursor", "must be the next_cursor of the previous page")
        runs = recent_runs(dag_id, limit=limit + 1, before_id=cursor)
        page = runs[:limit]
        with _hook(connection_id, field="dag_id") as hook:
            answer = maps_reader.dag_runs(hook, dag_id, page)
        answer["next_cursor"] = page[-1]["id"] if len(runs) > limit else None
        return answer

    @app.get(maps + "/dags/{dag_id}/run", dependencies=access)
    def run_maps(connection_id: str, dag_id: str, run_id: str) -> dict[str, Any]:
        """Entries and bytes (per task) of one run's XCom map and task-state map. No values."""
        _id("dag_id", dag_id)
        _id("run_id", run_id)
        with _hook(connection_id, field="run_id") as hook:
            return maps_reader.run_summary(hook, dag_id, run_id)

    def _run_page(
        connection_id: str, dag_id: str, run_id: str, store: str, cursor: str | None, limit: int, *, values: bool
    ) -> dict[str, Any]:
        _id("dag_id", dag_id)
        _id("run_id", run_id)
        _store(store)
        _page_args(cursor, limit)
        with _hook(connection_id, field="run_id") as hook:
            return maps_reader.run_entries(hook, dag_id, run_id, store=store, cursor=cursor, limit=limit, values=values)

    @app.get(maps + "/dags/{dag_id}/run/entries", dependencies=access)
    def run_entries(
        connection_id: str, dag_id: str, run_id: str, store: str = "xcom", cursor: str | None = None, limit: int = 50
    ) -> dict[str, Any]:
        """One page of a run's entries of ``store`` (task, map index, key, size, type, time): no values."""
        return _run_page(connection_id, dag_id, run_id, store, cursor, limit, values=False)

    @app.get(maps + "/dags/{dag_id}/run/values", dependencies=xcom_access)
    def run_values(
        connection_id: str, dag_id: str, run_id: str, store: str = "xcom", cursor: str | None = None, limit: int = 50
    ) -> dict[str, Any]:
        """The page of :func:`run_entries` with the values: only for users who may read the DAG's XComs."""
        return _run_page(connection_id, dag_id, run_id, store, cursor, limit, values=True)


def _add_asset_map_routes(app: FastAPI, maps: str, access: list[Any]) -> None:
    """An asset's state map (values only with the right to read assets)."""

    @app.get(maps + "/asset", dependencies=access)
    def asset_map(connection_id: str, name: str) -> dict[str, Any]:
        """Entries and bytes of an asset's state map (by asset name). No values."""
        _id("name", name, MAX_ASSET_NAME_CHARS)
        with _hook(connection_id, field="name") as hook:
            return maps_reader.asset_summary(hook, name)

    def _asset_page(connection_id: str, name: str, cursor: str | None, limit: int, *, values: bool) -> dict[str, Any]:
        _id("name", name, MAX_ASSET_NAME_CHARS)
        _page_args(cursor, limit)
        with _hook(connection_id, field="name") as hook:
            return maps_reader.asset_entries(hook, name, cursor=cursor, limit=limit, values=values)

    @app.get(maps + "/asset/entries", dependencies=access)
    def asset_entries(connection_id: str, name: str, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
        """One page of an asset's state keys (size, expiry): no values."""
        return _asset_page(connection_id, name, cursor, limit, values=False)

    @app.get(maps + "/asset/values", dependencies=[*access, _asset_access()])
    def asset_values(connection_id: str, name: str, cursor: str | None = None, limit: int = 50) -> dict[str, Any]:
        """The page of :func:`asset_entries` with the values: only for users who may read assets."""
        return _asset_page(connection_id, name, cursor, limit, values=True)


def _add_subscription_routes(app: FastAPI, base: str, access: list[Any]) -> None:
    """Committed offsets and lag of a subscription."""

    @app.get(base + "/subscription", dependencies=access)
    def subscription(connection_id: str, topic: str, subscription: str) -> dict[str, Any]:
        """Committed offset, end offset and lag per partition of ``subscription`` on ``topic``."""
        _check_text("subscription", subscription, MAX_TOPIC_CHARS)
        if not subscription.strip():
            raise _bad("subscription", "must not be empty")
        with _hook(connection_id) as hook:
            return state_reader.subscription(hook, _topic(topic), subscription)


app = create_app()
