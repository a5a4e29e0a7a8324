"""``PulsarStatePlugin``: the "Pulsar State" entry of the Airflow UI and the API behind it.

Loaded whenever the provider is installed: it is both an ``airflow.plugins`` entry point and the
``plugins`` entry of the provider info (which Airflow reads only with
``[core] lazy_discover_providers = False``). It adds

- a FastAPI app mounted on the API server at ``/pulsarstate`` (:mod:`.state_api`): the read-only
  REST API under ``/pulsarstate/api/`` and the page itself at ``/pulsarstate/``;
- an external view: a navigation entry "Pulsar State" showing that page in the UI's frame
  (at ``/plugin/pulsar-state``);
- the operator extra links of :mod:`.links`.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_pulsarstate.plugins import links
from airflow_provider_pulsarstate.plugins.state_api import URL_PREFIX, app

PLUGIN_NAME = "pulsarstate"
URL_ROUTE = "pulsar-state"


class PulsarStatePlugin(AirflowPlugin):
    """The provider's UI plugin (see the module docstring)."""

    name = PLUGIN_NAME
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Pulsar State API"}]
    external_views = [
        {
            "name": "Pulsar State",
            "href": URL_PREFIX + "/",
            "destination": "nav",
            "url_route": URL_ROUTE,
            "icon": URL_PREFIX + "/icon.svg",
        }
    ]
    operator_extra_links = [cls() for cls in links.ALL_LINKS]
