"""Real Airflow processes for tests that ``dag.test()`` cannot show.

``dag.test()`` runs deferred tasks' triggers inline, bypasses ``start_from_trigger`` and never
runs asset watchers. :class:`AirflowProcesses` starts the real components instead: ``api-server``
(the task SDK's execution API), ``scheduler`` (LocalExecutor), ``dag-processor`` and ``triggerer``,
on a throw-away AIRFLOW_HOME with a SQLite metadata DB, on free loopback ports, and talks to them
through the REST API. Each component can be killed (SIGKILL) and restarted on its own.

Usage::

    with AirflowProcesses(home=tmp_path / "airflow", dags_folder=my_dags, env={"AIRFLOW_CONN_X": "..."}) as af:
        af.wait_for_dag("my_dag")
        run_id = af.trigger("my_dag", conf={"n": 3})
        assert af.wait_for_run("my_dag", run_id) == "success"

It imports nothing from Airflow (it runs the ``airflow`` CLI next to ``sys.executable``, or the one given:
another venv's, to test an installed wheel).
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import requests

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
_TERMINAL = {"success", "failed"}


def free_port() -> int:
    """A loopback TCP port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def copy_sqlite_db(source: Path, target: Path) -> None:
    """Copy a SQLite DB through SQLite's backup API (safe while others have it open)."""
    src, dst = sqlite3.connect(source, timeout=60), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


class AirflowProcessError(RuntimeError):
    """A component did not start, died, or a run did not reach the expected state; the message
    carries the end of the component's log."""


class AirflowProcesses:
    """The Airflow components as separate OS processes (see the module docstring).

    :param home: AIRFLOW_HOME (created; the SQLite DB and logs live there).
    :param dags_folder: the DAG files to serve.
    :param env: extra environment for every component (connections, provider config).
    :param components: which to start (all four by default).
    :param parallelism: LocalExecutor worker processes.
    :param start_timeout: seconds for the DB migration and each component to come up.
    :param airflow: the ``airflow`` executable (default: the one next to ``sys.executable``).
    :param metadata_db: a SQLite metadata DB already migrated by the same Airflow version, copied
        (SQLite backup API) to start from instead of running ``airflow db migrate`` (~12 s of CPU).
    :param component_env: extra environment for one component only, by component name (over ``env``).
    """

    def __init__(
        self,
        *,
        home: Path,
        dags_folder: Path,
        env: Mapping[str, str] | None = None,
        components: Iterable[str] = COMPONENTS,
        parallelism: int = 4,
        start_timeout: float = 180.0,
        airflow: str | Path | None = None,
        metadata_db: Path | None = None,
        component_env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.home = Path(home)
        self.metadata_db = Path(metadata_db) if metadata_db is not None else None
        self.dags_folder = Path(dags_folder)
        self.components = tuple(components)
        unknown = set(self.components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown Airflow components {sorted(unknown)}; choose from {COMPONENTS}")
        self.component_env = {name: dict(extra) for name, extra in (component_env or {}).items()}
        if unknown := set(self.component_env) - set(COMPONENTS):
            raise ValueError(
                f"component_env names unknown Airflow components {sorted(unknown)}; choose from {COMPONENTS}"
            )
        self.start_timeout = start_timeout
        self.api_port = free_port()
        self.airflow = str(airflow or Path(sys.executable).with_name("airflow"))
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": "pulsarstate-test-processes-" + os.urandom(16).hex(),
            # One key for every component: with a copied metadata DB no `db migrate` writes airflow.cfg
            # first, and components starting together would each generate a key of their own (the
            # triggerer then cannot read the trigger kwargs the dag-processor encrypted).
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{self.api_port}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.api_port}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            # Tasks call the API server as they start; with every CPU busy (a CI machine running
            # other tests) one call can take longer than the 5 s default, and the task fails unrun.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            **(env or {}),
        }
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._session = requests.Session()

    # -- lifecycle ---------------------------------------------------------------------------
    def log_path(self, component: str) -> Path:
        return self.home / "process-logs" / f"{component}.log"

    def start(self) -> AirflowProcesses:
        """Migrate the DB (or copy ``metadata_db``), then start every component and wait until the API answers."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "process-logs").mkdir(exist_ok=True)
        if self.metadata_db is not None:
            copy_sqlite_db(self.metadata_db, self.home / "airflow.db")
        else:
            migrate = subprocess.run(
                [self.airflow, "db", "migrate"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.start_timeout,
            )
            if migrate.returncode != 0:
                raise AirflowProcessError(
                    f"airflow db migrate failed:\n{migrate.stdout[-2000:]}\n{migrate.stderr[-2000:]}"
                )
        for component in self.components:
            self.start_component(component)
        if "api-server" in self.components:
            self._wait(lambda: self._get("/api/v2/monitor/health") is not None, "the API server to answer")
        return self

    def start_component(self, component: str) -> None:
        """Start (or restart) one component."""
        if component in self._procs and self._procs[component].poll() is None:
            raise AirflowProcessError(f"{component} is already running (pid {self._procs[component].pid})")
        args = [self.airflow, component] + (["--port", str(self.api_port)] if component == "api-server" else [])
        log = open(self.log_path(component), "ab")  # noqa: SIM115 - owned by the process
        try:
            self._procs[component] = subprocess.Popen(
                args,
                env={**self.env, **self.component_env.get(component, {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def kill(self, component: str, *, sig: int = signal.SIGKILL) -> None:
        """Kill one component's whole process group (SIGKILL by default: no clean shutdown)."""
        proc = self._procs.get(component)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)

    def restart(self, component: str) -> None:
        self.kill(component)
        self.start_component(component)

    def alive(self, component: str) -> bool:
        proc = self._procs.get(component)
        return proc is not None and proc.poll() is None

    def stop(self) -> None:
        """Stop every component: SIGTERM, then SIGKILL after a grace period."""
        for component in reversed(list(self._procs)):
            self.kill(component, sig=signal.SIGTERM)
            self.kill(component)
        self._procs.clear()
        self._session.close()

    def __enter__(self) -> AirflowProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tail(self, component: str, chars: int = 3000) -> str:
        """The end of a component's log (for failure messages)."""
        try:
            return self.log_path(component).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- REST --------------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def login(self, username: str, password: str) -> None:
        """Send every later request with a bearer token of ``username`` (SimpleAuthManager logins
        on), as the UI does."""
        resp = self._session.post(
            self.api_url + "/auth/token", json={"username": username, "password": password}, timeout=30
        )
        if resp.status_code != 201:
            raise AirflowProcessError(f"login as {username!r} answered {resp.status_code}: {resp.text[:500]}")
        self._session.headers["Authorization"] = f"Bearer {resp.json()['access_token']}"

    def send(self, method: str, path: str, body: Mapping[str, Any] | None = None, *, timeout: float = 30) -> Any:
        """The JSON answer to a request that must answer 200 or 201 (else AirflowProcessError)."""
        resp = self._session.request(method, self.api_url + path, json=body, timeout=timeout)
        if resp.status_code not in (200, 201):
            raise AirflowProcessError(f"{method} {path} answered {resp.status_code}: {resp.text[:500]}")
        return resp.json()

    def _get(self, path: str) -> Any:
        """The JSON answer to a GET, or None when there is no 200 answer (yet)."""
        try:
            resp = self._session.get(self.api_url + path, timeout=10)
        except requests.RequestException:
            return None
        return resp.json() if resp.status_code == 200 else None

    def _wait(self, predicate: Any, what: str, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout if timeout is not None else self.start_timeout)
        while True:
            value = predicate()
            if value:
                return value
            dead = [c for c in self._procs if not self.alive(c)]
            if dead:
                raise AirflowProcessError(
                    f"waiting for {what}: {', '.join(dead)} died\n"
                    + "\n".join(f"--- {c}:\n{self.tail(c)}" for c in dead)
                )
            if time.monotonic() >= deadline:
                raise AirflowProcessError(f"timed out waiting for {what}")
            time.sleep(0.5)

    def wait_for_dag(self, dag_id: str, *, unpause: bool = True, timeout: float | None = None) -> None:
        """Wait until the dag-processor serialized ``dag_id``; unpause it (all DAGs start paused)."""
        self._wait(lambda: self._get(f"/api/v2/dags/{dag_id}"), f"DAG {dag_id} to be parsed", timeout)
        if unpause:
            self.send("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, *, conf: Mapping[str, Any] | None = None) -> str:
        """Create a manual DAG run; returns its run id."""
        body = {"logical_date": None, "conf": dict(conf or {})}
        return str(self.send("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"])

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's runs (id, state, run type, ...), oldest first."""
        data = self._get(f"/api/v2/dags/{dag_id}/dagRuns?order_by=id&limit=1000") or {}
        return list(data.get("dag_runs", []))

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        data = self._get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=1000") or {}
        return list(data.get("task_instances", []))

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """A task's XCom value as the API returns it (None when absent)."""
        data = self._get(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}?deserialize=true"
        )
        return None if data is None else data.get("value")

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        data = self._get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        return None if data is None else data.get("state")

    def wait_for_run(self, dag_id: str, run_id: str, *, timeout: float = 300.0) -> str:
        """Wait until the run finished; returns ``success`` or ``failed``."""
        return str(
            self._wait(
                lambda: s if (s := self.run_state(dag_id, run_id)) in _TERMINAL else None,
                f"run {run_id} of {dag_id} to finish",
                timeout,
            )
        )

    def wait_for_task_state(
        self, dag_id: str, run_id: str, task_id: str, states: Iterable[str], *, timeout: float = 300.0
    ) -> str:
        """Wait until a task instance is in one of ``states``; returns the state."""
        wanted = set(states)

        def state() -> str | None:
            for ti in self.task_instances(dag_id, run_id):
                if ti.get("task_id") == task_id and ti.get("state") in wanted:
                    return str(ti["state"])
            return None

        return str(self._wait(state, f"task {task_id} of {run_id} to be {sorted(wanted)}", timeout))
