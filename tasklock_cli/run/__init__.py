"""One ``tasklock run``, from its options to its exit code.

- ``options`` and ``command``: what was asked, and ``run``'s body.
- ``supervisor``: signals, the command, the clock, loss and release.
- ``announce`` and ``environment``: the words of the run's events; the variables the
  command (and a hook) is given.
- ``holding``, ``keeper``, ``waiter``, ``heartbeat``, ``schedule``: the leases held, each
  lease's client-side deadline, acquiring with waiting, renewing, and when to renew.
- ``conflict`` and ``windows``: a held lock described; ``--once-per``'s windows.
"""
