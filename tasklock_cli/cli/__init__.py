"""The command line: parsing and rendering only.

- ``entry``: the ``tasklock`` entry point, and a fast parser for a plain ``run`` (no typer).
- ``argv``: where ``run``'s options end, the one rule both parsers use.
- ``app``: the typer commands; ``session``: global options, the store and config they
  select, and the one boundary where errors become exit codes.
- ``render``: tables and listings for people.
"""
