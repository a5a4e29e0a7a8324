"""Recipes: small classes over the state engine's primitives (like kazoo's ``recipe`` package)."""

from airflow_provider_pulsarstate.recipes.map import MapChange, PulsarMap

__all__ = ["MapChange", "PulsarMap"]
