"""Python scripts run in child processes forked from a warm parent, for tests that start many
``dag.test()`` runs in processes of their own.

A cold process pays ~20 CPU-s before its first task runs: importing Airflow, and Airflow's
in-process execution API building its versioned (Cadwyn/pydantic) schemas on its first request.
A :class:`WarmPython` parent pays that once; every script then runs in a child forked from it,
which behaves as ``python script.py args`` under the given environment (its own pid, exit code,
SIGKILL, stdout and stderr, ``sys.argv``, ``__main__``, atexit handlers).

One parent serves one Airflow configuration: Airflow reads its settings (metadata DB, home)
while it is imported, so :func:`run_warm` keeps one parent per set of ``AIRFLOW__*`` /
``AIRFLOW_HOME`` values and only the rest of the environment (connections, variables, anything
read at run time) may differ between the scripts one parent runs.

The parent process keeps no thread alive when it forks: the execution API's event-loop thread
of the warm-up is stopped first, and every child starts its own on the warm app.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_READY = "WARM-PYTHON-READY"


# ------------------------------------------------------------------------------------ the parent
def _warm() -> None:
    """Import what a pipeline run imports and build the in-process execution API once."""
    import gc

    import airflow.models.dagrun  # noqa: F401
    import airflow.models.xcom  # noqa: F401
    import airflow.providers.apache.spark.operators.spark_submit  # noqa: F401
    import airflow.sdk.execution_time.task_runner  # noqa: F401
    from airflow.api_fastapi.execution_api.app import InProcessExecutionAPI
    from airflow.dag_processing.dagbag import DagBag  # noqa: F401
    from airflow.sdk.execution_time import supervisor

    api = InProcessExecutionAPI()
    client = supervisor.InProcessTestSupervisor._Client(base_url=None, token="", dry_run=True, transport=api.transport)
    client.base_url = "http://in-process.invalid./"
    client.get("health")  # the first request builds the versioned schemas, whatever its answer
    app = api.app
    del client, api
    gc.collect()  # the transport's finalizer stops its event-loop thread: fork with one thread only
    if threading.active_count() != 1:
        raise RuntimeError(f"threads left before forking: {[t.name for t in threading.enumerate()]}")

    def warm_api() -> InProcessExecutionAPI:
        fresh = InProcessExecutionAPI()
        fresh._app = app  # the warm app; the transport (and its loop thread) is made in the child
        return fresh

    import functools

    # dag.test() asks this (cached) factory for the API of every task it runs
    supervisor.in_process_api_server = functools.lru_cache(maxsize=1)(warm_api)


def _child(request: dict[str, Any]) -> None:
    """Become ``python <script> <args>`` under the request's environment; never returns."""
    code: int = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            target = os.open(path, flags, 0o644)
            os.dup2(target, fd)
            os.close(target)
        script = request["script"]
        sys.argv = [script, *request["args"]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _supervise(conn: socket.socket) -> None:
    """In a forked helper: fork the script's process, tell the client its pid, then its exit code."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with conn, conn.makefile("rwb") as stream:
        request = json.loads(stream.readline())
        pid = os.fork()
        if pid == 0:
            stream.close()
            conn.close()
            _child(request)
        stream.write(json.dumps({"pid": pid}).encode() + b"\n")
        stream.flush()
        _, status, usage = os.wait4(pid, 0)
        done = {"returncode": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime}
        stream.write(json.dumps(done).encode() + b"\n")
        stream.flush()
    os._exit(0)


def serve(socket_path: str) -> None:
    """Warm up, then fork one process per request until standard input closes."""
    _warm()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # helpers are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(64)
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    sys.stdout.write(f"{_READY} {usage.ru_utime + usage.ru_stime}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        readable, _, _ = select.select([server, sys.stdin], [], [])
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):
            return
        if server in readable:
            conn, _ = server.accept()
            if os.fork() == 0:
                server.close()
                _supervise(conn)
            conn.close()


# ------------------------------------------------------------------------------------ the client
class WarmProcess:
    """One script running in a child of a :class:`WarmPython` parent, as ``subprocess.Popen``
    would show it: ``pid``, :meth:`wait`, :meth:`kill`, ``returncode``, and the output."""

    def __init__(self, conn: socket.socket, stdout: Path, stderr: Path) -> None:
        self._conn, self._buffer = conn, b""
        self._stdout, self._stderr = stdout, stderr
        self.pid: int = json.loads(self._line(None))["pid"]
        self.returncode: int | None = None

    def _line(self, timeout: float | None) -> bytes:
        """The helper's next line (``b""`` if it went away); ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            self._conn.settimeout(None if deadline is None else max(0.001, deadline - time.monotonic()))
            chunk = self._conn.recv(4096)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (negative: the signal that ended it); ``subprocess.TimeoutExpired`` after
        ``timeout`` seconds (the process is left running, as with Popen)."""
        if self.returncode is None:
            try:
                line = self._line(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(str(self._stdout), timeout or 0.0) from None
            if not line:
                raise RuntimeError(f"the warm parent lost process {self.pid}")
            done = json.loads(line)
            self.returncode = int(done["returncode"])
            _CPU[0] += float(done["cpu"])
            self._conn.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    @property
    def stdout(self) -> str:
        return self._stdout.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self._stderr.read_text(errors="replace")


class WarmPython:
    """A warm parent process (Airflow imported, the execution API built) forking the scripts it is
    given. Start it with the environment whose Airflow configuration the scripts share."""

    def __init__(self, env: Mapping[str, str], *, start_timeout: float = 300.0) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="warm-python-"))
        self._socket = str(self._dir / "socket")
        self._log = self._dir / "parent.log"
        self._count = 0
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.airflow.warm_python", self._socket],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)},
                cwd=ROOT,
            )
        assert self._proc.stdout is not None
        deadline = time.monotonic() + start_timeout
        line = b""
        while time.monotonic() < deadline and self._proc.poll() is None:
            if select.select([self._proc.stdout], [], [], 1.0)[0]:
                line = self._proc.stdout.readline()
                ready, _, cpu = line.decode(errors="replace").strip().partition(" ")
                if ready == _READY:
                    _CPU[0] += float(cpu)
                    return
        self.close()
        raise RuntimeError(f"the warm Python parent did not start: {line!r}\n{self._log.read_text()[-4000:]}")

    def start(
        self, script: str | Path, args: Sequence[str] = (), *, env: Mapping[str, str], cwd: str | Path | None = None
    ) -> WarmProcess:
        """``python script args`` under ``env`` in a forked child; returns at once."""
        self._count += 1
        out, err = self._dir / f"{self._count}.out", self._dir / f"{self._count}.err"
        request = {
            "script": str(script),
            "args": list(args),
            "env": dict(env),
            "cwd": str(cwd or os.getcwd()),
            "stdout": str(out),
            "stderr": str(err),
        }
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self._socket)
        conn.sendall(json.dumps(request).encode() + b"\n")
        return WarmProcess(conn, out, err)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


_CPU = [0.0]


def cpu_seconds() -> float:
    """CPU seconds of this process's warm parents' start-up and of the children they ran to their
    end (the scripts and what they waited for): not in this process's own children's rusage."""
    return _CPU[0]


MAX_PARENTS = 2  # each holds an imported Airflow (~300 MB); a test's own AIRFLOW_HOME needs its own

_PARENTS: dict[tuple[tuple[str, str], ...], WarmPython] = {}


def _airflow_settings(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What a parent fixes at import: Airflow's settings; connections and variables are read later."""
    return tuple(
        sorted(
            (k, v)
            for k, v in env.items()
            if (k.startswith("AIRFLOW") and not k.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_")))
            or k in ("PYTHONPATH", "PATH")
        )
    )


def run_warm(
    script: str | Path, args: Sequence[str] = (), *, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, script, *args], env=env, capture_output=True, text=True,
    timeout=timeout)``, forked from this test process's warm parent for ``env``'s Airflow settings."""
    key = _airflow_settings(env)
    parent = _PARENTS.pop(key, None) or WarmPython(env)
    _PARENTS[key] = parent  # the most recently used last
    while len(_PARENTS) > MAX_PARENTS:
        _PARENTS.pop(next(iter(_PARENTS))).close()
    proc = parent.start(script, args, env=env)
    try:
        returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=60)
        raise
    return subprocess.CompletedProcess([str(script), *args], returncode, proc.stdout, proc.stderr)


@atexit.register
def _close_parents() -> None:
    for parent in _PARENTS.values():
        parent.close()
    _PARENTS.clear()


if __name__ == "__main__":
    serve(sys.argv[1])
