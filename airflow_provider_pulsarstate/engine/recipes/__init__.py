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

__all__ = ["MapChange", "PulsarMap", "SourceRange", "StateTable", "TableChange", "ViewInfo", "ViewPlan", "ViewResult", "ViewStager", "register_scope_predicate"]
