"""The command's process tree: the guard process that outlives the wrapper, the wrapper's
side of it, the messages between them, and reading a tree from ``/proc``.
"""
