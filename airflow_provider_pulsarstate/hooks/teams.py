"""Airflow's multi-team mode (``[core] multi_team``): each team must have its own key namespace and topics.

The XCom and state-store backends keep one deployment's entries apart from another's by key
namespace and topic; with several teams in one deployment, nothing else keeps team A's state from
team B's tasks. So in multi-team mode the backends refuse to start unless every team has its own
``[pulsarstate] key_namespace``, ``state_store_topic`` and ``xcom_topic`` (team-scoped values:
section ``<team>=pulsarstate`` or ``AIRFLOW__<TEAM>___PULSARSTATE__<OPTION>``), none shared with
another team or with the deployment-wide values. The teams are read from the metadata DB where it
is reachable, else from ``[pulsarstate] teams`` (comma-separated; task processes have no DB).

What this cannot do: every worker holds its connection's Pulsar role, so code in a task can open
any topic that role may read. Give each team its own connection (``<team>=pulsarstate`` ``conn_id``)
with a Pulsar role allowed only on that team's topics: per-team roles are the defence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.provider_settings import SECTION

TEAM_OPTIONS = ("key_namespace", "state_store_topic", "xcom_topic")
"""What each team must have of its own."""


def _conf() -> Any:
    from airflow.sdk.configuration import conf

    return conf


def teams_from_db() -> set[str] | None:
    """The teams the metadata DB lists, or None where this process cannot read it (a task process);
    an empty answer, as None, falls back to ``[pulsarstate] teams``."""
    try:
        from airflow.models.team import Team

        return set(Team.get_all_team_names())
    except Exception:
        return None


def refuse_shared_team_settings(
    conf: Any = None,
    *,
    list_teams: Callable[[], Iterable[str] | None] = teams_from_db,
) -> None:
    """Return when ``[core] multi_team`` is off or every team has its own namespace and topics.

    :raises ConfigurationError: multi-team mode, and the teams cannot be listed here, or a team lacks
        its own ``key_namespace``, or shares a namespace or topic with another team or the
        deployment-wide value; the message names the teams, the option and what to configure.
    """
    conf = conf if conf is not None else _conf()
    if not conf.getboolean("core", "multi_team", fallback=False):
        return
    listed = list_teams()
    if not listed:
        listed = [t.strip() for t in (conf.get(SECTION, "teams", fallback="") or "").split(",") if t.strip()]
    teams = sorted(set(listed))
    if not teams:
        raise ConfigurationError(
            f"[core] multi_team is on, and this process cannot list the teams (no metadata DB here, and "
            f"[{SECTION}] teams is empty): set [{SECTION}] teams (AIRFLOW__PULSARSTATE__TEAMS) to the teams, "
            f"and give each its own {', '.join(TEAM_OPTIONS)} in section '<team>={SECTION}' "
            f"(AIRFLOW__<TEAM>___PULSARSTATE__KEY_NAMESPACE, ...)"
        )
    for option in TEAM_OPTIONS:
        holders: dict[str, str] = {(conf.get(SECTION, option, fallback="") or "").strip(): "the deployment-wide value"}
        for team in teams:
            value = (conf.get(SECTION, option, team_name=team, fallback="") or "").strip()
            if not value:
                raise ConfigurationError(
                    f"[core] multi_team is on, and team {team!r} has no [{SECTION}] {option} of its own: set it in "
                    f"section '{team}={SECTION}' (AIRFLOW__{team.upper()}___PULSARSTATE__{option.upper()}), "
                    f"different for every team"
                )
            if value in holders:
                raise ConfigurationError(
                    f"[core] multi_team is on, and team {team!r} shares [{SECTION}] {option} = {value!r} with "
                    f"{holders[value]}: each team needs its own {', '.join(TEAM_OPTIONS)} (section '{team}={SECTION}'), "
                    f"or its tasks could read and clean up the other's entries"
                )
            holders[value] = f"team {team!r}"
