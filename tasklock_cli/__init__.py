"""tasklock: run a command at most once at a time across processes and machines."""

__version__ = "0.1.0"
