"""Settings from the config file: finding it, trusting it, reading it (``file``); the table of
``run`` settings (``settings``); a setting's problem named by its line (``lines``).
"""
