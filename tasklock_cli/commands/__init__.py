"""The operators' commands with logic of their own: ``release --force``, ``check``,
``metrics``. (``peek``, ``list``, ``sweep``, ``history``, ``init`` and ``doctor`` are a store
call and a renderer each, in ``cli``.)
"""
