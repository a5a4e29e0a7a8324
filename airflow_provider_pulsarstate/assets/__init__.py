"""Pulsar topics and state tables as Airflow assets: the ``pulsar`` asset URI scheme and table outlets."""
