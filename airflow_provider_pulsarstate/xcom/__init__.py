"""The XCom backend that keeps values in Pulsar (``[core] xcom_backend``), and its clean-up.

``backend`` holds :class:`~airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend` (the path
deployments configure); its parts: ``references`` (what the metadata DB keeps and the checks
before one is followed), ``push`` (the write path), ``pull`` (the read path), ``run_stores``
(the stores a process opens) and ``task_context`` (which task instance is pushing).
"""
