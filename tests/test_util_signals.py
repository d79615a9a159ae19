"""util.signals, the run's signals without the standard library's ``signal`` (and its enum):
the same numbers, functions and names."""

from __future__ import annotations

import signal as stdlib_signal

import pytest

from tasklock_cli.util import signals


def test_every_name_it_offers_is_the_standard_modules():
    offered = [name for name in vars(signals) if name.startswith("SIG") or name == "ITIMER_REAL"]
    assert "SIGTERM" in offered
    for name in offered:
        ours, theirs = getattr(signals, name), getattr(stdlib_signal, name)
        assert ours == theirs and type(ours) is int, name
    for name in ("signal", "pthread_sigmask", "set_wakeup_fd", "setitimer"):
        assert callable(getattr(signals, name))


@pytest.mark.parametrize("signum", range(-2, 70))
def test_signal_name_is_the_enums(signum):
    try:
        expected = stdlib_signal.Signals(signum).name
    except ValueError as exc:
        with pytest.raises(ValueError) as caught:
            signals.signal_name(signum)
        assert str(caught.value) == str(exc)
    else:
        assert signals.signal_name(signum) == expected


def test_handlers_are_plain_ints_and_the_standard_module_takes_them_back():
    previous = signals.signal(stdlib_signal.SIGUSR2, signals.SIG_IGN)
    try:
        assert signals.signal(stdlib_signal.SIGUSR2, signals.SIG_DFL) == stdlib_signal.SIG_IGN
        assert stdlib_signal.getsignal(stdlib_signal.SIGUSR2) == signals.SIG_DFL
    finally:
        stdlib_signal.signal(stdlib_signal.SIGUSR2, previous)
