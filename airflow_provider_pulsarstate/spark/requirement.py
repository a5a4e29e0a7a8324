"""pyspark is optional: the core install serves every Airflow component, and only the workers that
run Spark jobs (and the jobs themselves) need it. Every Spark helper asks here first, so a missing
install fails with the command that fixes it instead of a bare ``No module named 'pyspark'``."""

from __future__ import annotations

from airflow_provider_pulsarstate.engine.errors import MissingExtraError

SPARK_EXTRA = "spark"
SPARK_INSTALL_HINT = "pip install 'airflow-provider-pulsarstate[spark]'"


def missing_spark(feature: str, cause: ImportError) -> MissingExtraError:
    """The error for ``feature`` used without the ``[spark]`` extra (``cause``: the failed import)."""
    return MissingExtraError(
        f"{feature} needs the Spark extra, which is not installed ({cause}): {SPARK_INSTALL_HINT}",
        extra=SPARK_EXTRA,
    )


def require_pyspark(feature: str) -> None:
    """Import pyspark.sql, or raise :class:`MissingExtraError` naming ``feature`` and the install command.

    :raises MissingExtraError: pyspark cannot be imported.
    """
    try:
        import pyspark.sql  # noqa: F401
    except ImportError as exc:
        raise missing_spark(feature, exc) from exc
