"""``airflow pulsarstate ...``: the provider's CLI commands (listed under ``cli`` in the provider info)."""
