"""The JVM settings of the short-lived JVMs the suite starts: its Pulsar brokers and every spark-submit.

Each lives minutes at most, on a machine whose CPUs the suite keeps busy. The C1 JIT compiler alone
and the serial GC cost less than C2 and G1's threads: C2 spends more CPU compiling than its faster
code saves in that time, and parallel GC threads compete with the other test workers. Measured on a
Pulsar standalone (2 vCPUs): 12.1 -> 5.6 CPU-s to start, 13.7 -> 7.9 CPU-s to serve the Pulsar
conformance and view tests; on a Spark job about -40% CPU.
"""

from __future__ import annotations

SHORT_LIVED_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:CICompilerCount=1")
