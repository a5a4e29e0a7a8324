"""Lineage: OpenLineage facets of the operators and sensor, and hook-level lineage.

Everything that needs ``apache-airflow-providers-openlineage`` is imported only when that provider
is installed (:func:`~airflow_provider_pulsarstate.lineage.facets.openlineage_available`); without
it the operators behave exactly as before and compute nothing for lineage.
"""
