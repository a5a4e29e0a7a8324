"""The task and asset state-store backend over a PulsarMap (``[state_store] backend`` /
``[workers] state_store_backend``)."""
