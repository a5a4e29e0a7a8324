"""The Airflow UI plugin: the "Pulsar State" page, its read-only REST API and the operators' links to it."""
