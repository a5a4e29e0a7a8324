"""Recipes: small classes over the state engine's primitives (like kazoo's ``recipe`` package)."""

from airflow_provider_pulsarstate.engine.recipes.map import MapChange, PulsarMap
from airflow_provider_pulsarstate.engine.recipes.table import (
    SourceRange,
    StateTable,
    TableChange,
    ViewInfo,
    ViewPlan,
    ViewResult,
    ViewStager,
    register_scope_predicate,
)
from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComRecord, XComStore

__all__ = [
    "MapChange",
    "PulsarMap",
    "SourceRange",
    "StateTable",
    "TableChange",
    "ViewInfo",
    "ViewPlan",
    "ViewResult",
    "ViewStager",
    "XComRecord",
    "XComStore",
    "register_scope_predicate",
]
