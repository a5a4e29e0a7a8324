"""The JVM settings of every ``spark-submit`` the suite starts, and their class-data archive.

Every Spark job of the suite is a short local-mode JVM that lives about a minute, on a machine whose
CPUs the suite keeps busy. Three settings cut what each one costs:

- the C1 JIT compiler only and the serial GC (``tests/jvm_options.py``, as for the suite's brokers):
  C2 would spend more CPU compiling than it saves, and parallel GC threads compete with the other
  test workers (about -40% CPU per job);
- an application class-data-sharing archive (AppCDS) of the classes a Spark job loads, written once
  by a warm-up job and then mapped by every job instead of loading and verifying ~10,000 classes
  again (about -5 CPU-s of ~17 per job).

The settings travel in ``SPARK_SUBMIT_OPTS`` (Spark's launcher adds it to the driver JVM) with the
Spark properties as ``-Dspark.*`` system properties, and ``SPARK_CONF_DIR`` points to an empty
directory: the conf directory is on the JVM's class path, and class-data sharing refuses a class
path holding a non-empty directory. A JVM whose archive is missing, still being written or made for
other jars (the deployment test's own venv) runs without it: slower, never different.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.jvm_options import SHORT_LIVED_JVM

SPARK_PROPERTIES = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
WARMUP_JOB = Path(__file__).with_name("spark_warmup_job.py")


def _archive(artifacts: Path) -> Path:
    """The archive's path, named after what it depends on (Spark's jars and the JVM options)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256(f"{pyspark.__version__}|{jars}|{SHORT_LIVED_JVM}|{sys.executable}".encode()).hexdigest()[:12]
    return artifacts / "spark-cds" / f"spark-{pyspark.__version__}-{key}.jsa"


def spark_environment(artifacts: Path) -> dict[str, str]:
    """``SPARK_CONF_DIR`` and ``SPARK_SUBMIT_OPTS`` for every spark-submit of the run."""
    conf_dir = artifacts / "spark-conf"  # empty on purpose: see the module docstring
    conf_dir.mkdir(parents=True, exist_ok=True)
    options = [*SHORT_LIVED_JVM, f"-XX:SharedArchiveFile={_archive(artifacts)}"]
    options += [f"-D{key}={value}" for key, value in SPARK_PROPERTIES.items()]
    return {"SPARK_CONF_DIR": str(conf_dir), "SPARK_SUBMIT_OPTS": " ".join(options)}


def start_class_archive(artifacts: Path, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Start the warm-up job that writes the class archive, unless it exists (None then).

    The job writes a temporary file, renamed into place as soon as the job ended well, so that the
    JVMs started meanwhile run without the archive rather than with half of one. Reap the process
    with :func:`finish_class_archive` before the run ends.
    """
    archive = _archive(artifacts)
    if archive.exists():
        return None
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    options = env["SPARK_SUBMIT_OPTS"].replace(
        f"-XX:SharedArchiveFile={archive}", f"-XX:ArchiveClassesAtExit={partial}"
    )
    bin_dir = Path(sys.executable).parent  # the venv's, where spark-submit finds pyspark
    spark_submit = bin_dir / "spark-submit"
    with open(archive.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(
            [
                "/bin/sh",
                "-c",
                '"$0" --master "local[2]" "$1" && mv -f "$2" "$3"',
                spark_submit,
                WARMUP_JOB,
                partial,
                archive,
            ],
            env={
                **os.environ,
                **env,
                "SPARK_SUBMIT_OPTS": options,
                "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def finish_class_archive(proc: subprocess.Popen[bytes] | None, artifacts: Path) -> str:
    """Wait for the warm-up job (if one was started); what became of the archive, for the log."""
    archive = _archive(artifacts)
    if proc is not None:
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for partial in archive.parent.glob(f"{archive.stem}.{os.getpid()}.partial"):
            partial.unlink()
    if archive.exists():
        return f"Spark class archive {archive} ({archive.stat().st_size / 2**20:.0f} MB)"
    return f"no Spark class archive: the warm-up job failed, see {archive.with_suffix('.log')}"
