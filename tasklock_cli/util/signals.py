"""What a run needs of signals, from ``_signal``, without the standard library's ``signal``
module: that one imports ``enum`` to wrap the same functions in its ``Signals``, ``Handlers``
and ``Sigmasks`` IntEnums (enum and the conversion, ~5 ms of every start). Here signals and
``SIG_DFL``/``SIG_IGN`` are plain ints, which is what the IntEnums equal; ``signal_name``
stands in for ``signal.Signals(n).name``.

The run's modules import it as ``signal`` (``from tasklock_cli.util import signals as
signal``): the names they use are the standard module's, with its meaning. The type checker
is shown the standard module's names (``_signal`` has no stubs).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from signal import ITIMER_REAL as ITIMER_REAL
    from signal import SIG_BLOCK as SIG_BLOCK
    from signal import SIG_DFL as SIG_DFL
    from signal import SIG_IGN as SIG_IGN
    from signal import SIG_SETMASK as SIG_SETMASK
    from signal import SIGALRM as SIGALRM
    from signal import SIGCHLD as SIGCHLD
    from signal import SIGCONT as SIGCONT
    from signal import SIGHUP as SIGHUP
    from signal import SIGINT as SIGINT
    from signal import SIGKILL as SIGKILL
    from signal import SIGPIPE as SIGPIPE
    from signal import SIGQUIT as SIGQUIT
    from signal import SIGTERM as SIGTERM
    from signal import SIGTSTP as SIGTSTP
    from signal import SIGTTIN as SIGTTIN
    from signal import SIGTTOU as SIGTTOU
    from signal import SIGUSR1 as SIGUSR1
    from signal import SIGUSR2 as SIGUSR2
    from signal import SIGXFSZ as SIGXFSZ
    from signal import Signals as Signals
    from signal import pthread_sigmask as pthread_sigmask
    from signal import set_wakeup_fd as set_wakeup_fd
    from signal import setitimer as setitimer
    from signal import signal as signal
else:
    from _signal import ITIMER_REAL as ITIMER_REAL
    from _signal import SIG_BLOCK as SIG_BLOCK
    from _signal import SIG_DFL as SIG_DFL
    from _signal import SIG_IGN as SIG_IGN
    from _signal import SIG_SETMASK as SIG_SETMASK
    from _signal import SIGALRM as SIGALRM
    from _signal import SIGCHLD as SIGCHLD
    from _signal import SIGCONT as SIGCONT
    from _signal import SIGHUP as SIGHUP
    from _signal import SIGINT as SIGINT
    from _signal import SIGKILL as SIGKILL
    from _signal import SIGPIPE as SIGPIPE
    from _signal import SIGQUIT as SIGQUIT
    from _signal import SIGTERM as SIGTERM
    from _signal import SIGTSTP as SIGTSTP
    from _signal import SIGTTIN as SIGTTIN
    from _signal import SIGTTOU as SIGTTOU
    from _signal import SIGUSR1 as SIGUSR1
    from _signal import SIGUSR2 as SIGUSR2
    from _signal import SIGXFSZ as SIGXFSZ
    from _signal import pthread_sigmask as pthread_sigmask
    from _signal import set_wakeup_fd as set_wakeup_fd
    from _signal import setitimer as setitimer
    from _signal import signal as signal

_NAMES: dict[int, str] | None = None


def signal_name(signum: int) -> str:
    """``signal.Signals(signum).name``: ``SIGTERM`` for 15, the first name in alphabetical
    order where a number has several (``SIGABRT``, not ``SIGIOT``), as the enum picks it
    from the same module's names; ValueError, as the enum's, for a number it has none for."""
    global _NAMES
    if _NAMES is None:
        import _signal  # type: ignore[import-not-found]  # (it has no stubs)

        named = [
            (value, name)
            for name, value in vars(_signal).items()
            if name.isupper() and name.startswith("SIG") and not name.startswith("SIG_")
        ]
        _NAMES = {}
        for value, name in sorted(named):
            _NAMES.setdefault(value, name)
    try:
        return _NAMES[signum]
    except KeyError:
        raise ValueError(f"{signum!r} is not a valid Signals") from None
