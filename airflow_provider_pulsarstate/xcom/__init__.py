"""The XCom backend that keeps values in a PulsarMap (``[core] xcom_backend``)."""
