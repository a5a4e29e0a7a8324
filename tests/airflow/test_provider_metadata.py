"""The provider info lists every hook, operator, sensor and trigger module, and each one imports."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import airflow_provider_pulsarstate

KINDS = ("hooks", "operators", "sensors", "triggers")


def _modules_in(kind: str) -> set[str]:
    package = importlib.import_module(f"airflow_provider_pulsarstate.{kind}")
    return {
        f"{package.__name__}.{info.name}"
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    }


def _listed(kind: str) -> list[str]:
    return [m for entry in airflow_provider_pulsarstate.get_provider_info()[kind] for m in entry["python-modules"]]


@pytest.mark.parametrize("kind", KINDS)
def test_every_module_is_listed_once(kind: str) -> None:
    listed = _listed(kind)
    assert len(listed) == len(set(listed)), f"{kind}: listed twice: {sorted(m for m in listed if listed.count(m) > 1)}"
    assert set(listed) == _modules_in(kind), (
        f"{kind}: missing from provider_info.py: {sorted(_modules_in(kind) - set(listed))}; "
        f"listed but absent: {sorted(set(listed) - _modules_in(kind))}"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_listed_module_imports(kind: str) -> None:
    for name in _listed(kind):
        importlib.import_module(name)


def test_the_package_name_is_the_distribution_name() -> None:
    from importlib.metadata import metadata

    assert (
        airflow_provider_pulsarstate.get_provider_info()["package-name"]
        == metadata("airflow-provider-pulsarstate")["Name"]
    )


def test_asset_uri_entries_name_importable_callables() -> None:
    from airflow.sdk.module_loading import import_string

    (entry,) = airflow_provider_pulsarstate.get_provider_info()["asset-uris"]
    assert entry["schemes"] == ["pulsar"]
    for field in ("handler", "factory", "to_openlineage_converter"):
        assert callable(import_string(entry[field])), f"{field}: {entry[field]}"
