"""L3 scheduler core: admission, batching, completion, lifetimes, faults, shutdown.

Decisions are plain code (see the ``admission``, ``delivery``, ``faults``, ``lifetimes`` and
``watchdog`` modules, tested without threads); the submitter and poller threads and the loop
callbacks of :mod:`.scheduler` only carry them out. Nothing here knows the public facades.
"""
