"""Sensors: wait for a topic's offsets (poke, reschedule or deferred to the triggerer)."""
