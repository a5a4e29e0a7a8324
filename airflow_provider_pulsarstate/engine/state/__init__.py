"""The parts behind :class:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager`, one job each.

* :mod:`.replica`: the local copy of the state (fences, reader, applied position) and its
  :class:`~.replica.ReplicaState`; :mod:`.bootstrap` starts it from a checkpoint or the log's beginning;
* :mod:`.committer`: the queue of writes, group commit and retries; :mod:`.custody` holds the
  exclusive writer; :mod:`.staging` turns a group of writes into one record;
* :mod:`.listeners`: change listeners; :mod:`.workers`: the follow thread and checkpoints;
* :mod:`.ops`: op generation and (de)serialization (pure); :mod:`.fence_book`: lease fences;
* :mod:`.stats`: the counters; :mod:`.assembly`: the manager's options and their wiring into parts;
* :mod:`.introspection`: read-only views of the parts.

Nothing here is public API: the manager is the one entry point.
"""
