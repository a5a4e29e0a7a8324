"""Triggers: waits that run in Airflow's triggerer without blocking its event loop."""
