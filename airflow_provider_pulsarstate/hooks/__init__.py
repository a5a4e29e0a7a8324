"""Airflow hooks of the provider (:class:`~.pulsarstate.PulsarStateHook`)."""
