"""The provider metadata Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

import copy
from typing import Any

from airflow_provider_pulsarstate import __version__
from airflow_provider_pulsarstate.hooks.connection_form import (
    CONN_FIELDS,
    CONN_TYPE,
    HOOK_CLASS_NAME,
    HOOK_NAME,
    UI_FIELD_BEHAVIOUR,
)
from airflow_provider_pulsarstate.provider_settings import OPTIONS, SECTION

PACKAGE_NAME = "airflow-provider-pulsarstate"


# Every module of these packages: tests/airflow/test_provider_metadata.py checks the lists are complete.
_MODULES: dict[str, tuple[str, ...]] = {
    "hooks": (
        "airflow_provider_pulsarstate.hooks.airflow_internals",
        "airflow_provider_pulsarstate.hooks.async_probes",
        "airflow_provider_pulsarstate.hooks.connection_config",
        "airflow_provider_pulsarstate.hooks.connection_form",
        "airflow_provider_pulsarstate.hooks.executor_policy",
        "airflow_provider_pulsarstate.hooks.process_shared",
        "airflow_provider_pulsarstate.hooks.pulsarstate",
        "airflow_provider_pulsarstate.hooks.shared_objects",
        "airflow_provider_pulsarstate.hooks.state_store_access",
        "airflow_provider_pulsarstate.hooks.teams",
        "airflow_provider_pulsarstate.hooks.topic_access",
    ),
    "operators": (
        "airflow_provider_pulsarstate.operators.leases",
        "airflow_provider_pulsarstate.operators.offsets",
        "airflow_provider_pulsarstate.operators.spark_submit",
        "airflow_provider_pulsarstate.operators.view_job",
        "airflow_provider_pulsarstate.operators.view_texts",
        "airflow_provider_pulsarstate.operators.views",
        "airflow_provider_pulsarstate.operators.xcom_cleanup",
    ),
    "sensors": (
        "airflow_provider_pulsarstate.sensors.leadership",
        "airflow_provider_pulsarstate.sensors.offsets",
        "airflow_provider_pulsarstate.sensors.trigger_start",
    ),
    "triggers": (
        "airflow_provider_pulsarstate.triggers.leadership",
        "airflow_provider_pulsarstate.triggers.leadership_conditions",
        "airflow_provider_pulsarstate.triggers.messages",
        "airflow_provider_pulsarstate.triggers.offsets",
        "airflow_provider_pulsarstate.triggers.polling",
        "airflow_provider_pulsarstate.triggers.offset_conditions",
        "airflow_provider_pulsarstate.triggers.shared_config",
        "airflow_provider_pulsarstate.triggers.shared_log",
        "airflow_provider_pulsarstate.triggers.start_gate",
        "airflow_provider_pulsarstate.triggers.state_change",
    ),
}


def provider_info() -> dict[str, Any]:
    """The dict ``get_provider_info()`` returns (connection types, hooks, operators, ...)."""
    return {
        "package-name": PACKAGE_NAME,
        "name": "Pulsar State",
        "description": "Consistent shared state for pipelines, kept in an Apache Pulsar topic.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Pulsar State",
                "external-doc-url": "https://pulsar.apache.org/",
                "tags": ["software"],
            }
        ],
        **_module_lists(),
        "plugins": [
            {
                "name": "pulsarstate",
                "plugin-class": "airflow_provider_pulsarstate.plugins.pulsar_state.PulsarStatePlugin",
            }
        ],
        "extra-links": [
            "airflow_provider_pulsarstate.plugins.links.PulsarStateViewLink",
            "airflow_provider_pulsarstate.plugins.links.PulsarStateTableLink",
            "airflow_provider_pulsarstate.plugins.links.PulsarStateLeaseLink",
            "airflow_provider_pulsarstate.plugins.links.PulsarStateSubscriptionLink",
        ],
        # pulsar://<tenant>/<namespace>/<topic>: topics and state tables as assets
        "asset-uris": [
            {
                "schemes": ["pulsar"],
                "handler": "airflow_provider_pulsarstate.assets.uri.sanitize_uri",
                "factory": "airflow_provider_pulsarstate.assets.scheme.create_asset",
                "to_openlineage_converter": "airflow_provider_pulsarstate.assets.scheme.convert_asset_to_openlineage",
            }
        ],
        # topic messages (PulsarMessageTrigger, common-messaging scheme "pulsar")
        "queues": ["airflow_provider_pulsarstate.queues.pulsar.PulsarMessageQueueProvider"],
        "cli": ["airflow_provider_pulsarstate.cli.commands.get_cli_commands"],
        "config": {
            SECTION: {
                "description": "The XCom and task/asset state-store backends kept in PulsarMaps.",
                "options": {name: {**copy.deepcopy(spec), "version_added": "0.1.0"} for name, spec in OPTIONS.items()},
            }
        },
        "connection-types": [
            {
                "connection-type": CONN_TYPE,
                "hook-class-name": HOOK_CLASS_NAME,
                "hook-name": HOOK_NAME,
                # copies: Airflow may mutate what it is given
                "conn-fields": copy.deepcopy(CONN_FIELDS),
                "ui-field-behaviour": copy.deepcopy(UI_FIELD_BEHAVIOUR),
            }
        ],
    }


def _module_lists() -> dict[str, list[dict[str, Any]]]:
    """The ``hooks``, ``operators``, ``sensors`` and ``triggers`` entries (new lists on each call)."""
    return {
        kind: [{"integration-name": "Pulsar State", "python-modules": list(modules)}]
        for kind, modules in _MODULES.items()
    }
