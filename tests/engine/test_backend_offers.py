"""Back ends are asked, not inspected: what callers need beyond the log contract (offset logs,
publishers, topic creation, compare-and-delete, leadership, the reachability check, the async
probes) is offered by the back end, answered through a wrapper by the store beneath it, and no
module outside the back ends switches on the back-end type."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.backends import Backend, backend_class
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.leadership import open_async_leadership_probe, read_leadership
from airflow_provider_pulsarstate.engine.offsets import (
    create_topic,
    delete_topic_if_unchanged,
    last_position,
    open_async_probe,
    open_publisher,
)
from airflow_provider_pulsarstate.testing.harness import ForwardingBackend

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_pulsarstate"

ANSWERED_BY_THE_BACK_ENDS = (
    "engine/backends/",
    "engine/config.py",  # the URL picks the back end: ``kind`` and the capabilities it implies
    "engine/offsets/embedded.py",  # the embedded offset log checks it was given an embedded config
    "engine/offsets/pulsar",  # the Pulsar offset log, its async probe and HTTP path
)
BACK_END_CLASSES = {"EmbeddedBackend", "PulsarBackend", "EmbeddedOffers", "PulsarOffers"}


def _switches(path: Path) -> list[str]:
    """Comparisons of ``.kind`` with a back-end name and isinstance checks against a back-end class."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides) and any(
                isinstance(s, ast.Constant) and s.value in ("embedded", "pulsar") for s in sides
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} compares .kind")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            }
            if names & BACK_END_CLASSES:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} isinstance of a back-end class")
    return found


def test_no_module_outside_the_back_ends_switches_on_their_type() -> None:
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if "pulsar_standalone" not in path.parts
        and not path.relative_to(PACKAGE).as_posix().startswith(ANSWERED_BY_THE_BACK_ENDS)
        for hit in _switches(path)
    ]
    assert found == []


def test_the_scan_finds_an_injected_switch(tmp_path: Path) -> None:
    module = tmp_path / "caller.py"
    module.write_text(
        "def f(config, backend):\n"
        "    if config.kind == 'embedded':\n"
        "        return isinstance(backend, EmbeddedBackend)\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        assert len(_switches(module)) == 2
    finally:
        PACKAGE = saved


def test_a_wrapper_is_answered_by_the_store_beneath_it(backend: Backend, topic: str) -> None:
    wrapped = ForwardingBackend(ForwardingBackend(backend))
    create_topic(wrapped, topic)
    with open_publisher(wrapped, topic) as publisher:
        publisher.send(b"one")
    [leadership] = read_leadership(wrapped, topic)
    assert leadership.partition is None
    last = last_position(backend, topic, timeout=15)
    assert last is not None
    assert wrapped.delete_topic_if_last(topic, None, timeout=15) is False  # not empty: kept
    assert delete_topic_if_unchanged(wrapped, topic, last=last, timeout=15) is True


class _Bare(ForwardingBackend):
    def underlying(self) -> Backend:
        return self


@pytest.mark.parametrize(
    ("ask", "what"),
    [
        (lambda b: b.open_offset_log("t"), "offset log"),
        (lambda b: b.open_publisher("t"), "publisher"),
        (lambda b: b.create_topic("t"), "topic creation"),
        (lambda b: b.delete_topic_if_last("t", None, timeout=1), "compare-and-delete"),
        (lambda b: b.read_leadership("t"), "leadership"),
        (lambda b: b.read_topic_message("t", b"id", timeout=1), "topic messages by id"),
    ],
)
def test_a_back_end_that_stores_nothing_itself_says_what_it_lacks(ask: Any, what: str, tmp_path: Path) -> None:
    config = ConnectionConfig(url=str(tmp_path / "s.db"))
    bare = _Bare(backend_class(config).from_config(config))
    with pytest.raises(ConfigurationError, match=f"_Bare offers no {what}"):
        ask(bare)


def test_the_embedded_log_keeps_no_message_ids(tmp_path: Path) -> None:
    config = ConnectionConfig(url=str(tmp_path / "s.db"))
    backend = backend_class(config).from_config(config)
    try:
        with pytest.raises(ConfigurationError, match="offers no topic messages by id"):
            backend.read_topic_message("persistent://public/default/t", b"id", timeout=1)
    finally:
        backend.close()
    assert not config.has_subscriptions and config.is_single_host
    assert backend_class(config).open_http_messages(config) is None


async def _close(probe: Any) -> None:
    await probe.aclose()


def test_the_config_picks_the_back_end_that_opens_its_probes(backend_config: ConnectionConfig) -> None:
    import asyncio

    cls = backend_class(backend_config)
    assert cls.__name__ == {"embedded": "EmbeddedBackend", "pulsar": "PulsarBackend"}[backend_config.kind]
    assert backend_config.is_single_host == (backend_config.kind == "embedded")
    assert backend_config.has_subscriptions == (backend_config.kind == "pulsar")
    offsets, leadership = open_async_probe(backend_config), open_async_leadership_probe(backend_config)
    assert type(offsets).__name__.startswith(cls.__name__.removesuffix("Backend"))
    assert type(leadership).__name__.startswith(cls.__name__.removesuffix("Backend"))
    asyncio.run(_close(offsets))
    asyncio.run(_close(leadership))
    ok, message = cls.check_reachable(backend_config)
    assert ok, message


def test_what_a_pulsar_back_end_offers_is_asked_without_loading_the_client_library() -> None:
    """A task process pushing small XComs and a triggerer starting probes on its loop ask the
    back end for its HTTP message path and async probes: that must not import ``pulsar`` (~0.3 s
    of CPU per process, on the loop for a triggerer)."""
    script = textwrap.dedent("""
        import sys
        from airflow_provider_pulsarstate.engine.config import ConnectionConfig
        from airflow_provider_pulsarstate.engine.leadership import open_async_leadership_probe
        from airflow_provider_pulsarstate.engine.offsets import open_async_probe
        from airflow_provider_pulsarstate.engine.backends import backend_offers

        config = ConnectionConfig(url="pulsar://127.0.0.1:6650", admin_url="http://127.0.0.1:8080")
        assert backend_offers(config).open_http_messages(config) is not None
        open_async_probe(config)
        open_async_leadership_probe(config)
        print("pulsar" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "False"
