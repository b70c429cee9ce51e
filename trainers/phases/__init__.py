"""One executor per phase kind, one module each: ``rr``, ``dpsgd``, ``walr``, ``calibration``, ``count``.

Each registers its executor in ``trainers.phases.registry`` when imported;
``trainers.executors`` imports them all and is what the dispatch sites use.
"""
