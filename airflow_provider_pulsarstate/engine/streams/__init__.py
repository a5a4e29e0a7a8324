"""The parts of :mod:`airflow_provider_pulsarstate.engine.topic_stream`, one job each: the message
as plain data (:mod:`.message`), the options (:mod:`.options`), acknowledgement bookkeeping per
partition (:mod:`.lanes`), dead letters (:mod:`.dead_letters`) and what the streams of one event
loop share (:mod:`.clients`). Import the public names from ``engine.topic_stream``."""
