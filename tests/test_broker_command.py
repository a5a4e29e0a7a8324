"""The command line of the test broker (``PulsarStandalone``): JVM options and the garbage collector."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from airflow_provider_pulsarstate.testing.broker import PulsarStandalone
from tests.jvm_options import SHORT_LIVED_JVM


def _command(tmp_path: Path, jvm_options: Sequence[str] = ()) -> list[str]:
    broker = PulsarStandalone(data_dir=tmp_path, heap="512m", jvm_options=jvm_options)
    return broker._command("java", tmp_path / "lib", tmp_path / "standalone.conf", tmp_path / "log4j2.yaml")


def test_the_default_broker_runs_g1_with_the_full_jit(tmp_path: Path) -> None:
    cmd = _command(tmp_path)
    assert cmd[:4] == ["java", "-Xmx512m", "-XX:MaxDirectMemorySize=512m", "-XX:+UseG1GC"]
    assert not any(o.startswith("-XX:TieredStopAtLevel") for o in cmd)


def test_jvm_options_follow_the_heap_and_a_collector_among_them_replaces_g1(tmp_path: Path) -> None:
    cmd = _command(tmp_path, jvm_options=SHORT_LIVED_JVM)
    assert cmd[:3] == ["java", "-Xmx512m", "-XX:MaxDirectMemorySize=512m"]
    assert cmd[3 : 3 + len(SHORT_LIVED_JVM)] == list(SHORT_LIVED_JVM)
    assert "-XX:+UseG1GC" not in cmd  # two collectors would stop the JVM at start
    keeps_g1 = _command(tmp_path, jvm_options=("-XX:TieredStopAtLevel=1",))
    assert keeps_g1[3:5] == ["-XX:+UseG1GC", "-XX:TieredStopAtLevel=1"]
