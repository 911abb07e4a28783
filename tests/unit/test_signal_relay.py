"""agentq.signal_relay: a signal that lands while the main thread holds the lock its
reaction needs is still acted on (a plain handler waits for itself for ever)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from agentq.signal_relay import SignalRelay

# The main thread takes the Event's own lock, as `Event.wait` does, and the signal lands
# inside it: Python runs the handler at the next bytecode, still holding the lock.
SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading
    from agentq.signal_relay import SignalRelay

    stopping = threading.Event()
    if sys.argv[1] == "relay":
        SignalRelay(lambda signum: stopping.set()).install()
    else:
        signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    with stopping._cond:
        signal.raise_signal(signal.SIGTERM)
    print("set" if stopping.wait(10) else "not set", flush=True)
    """
)


def _run(how: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", SCRIPT, how]
    return subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)


def test_a_signal_inside_the_lock_its_reaction_takes_is_acted_on() -> None:
    done = _run("relay")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "set"


def test_a_plain_handler_in_the_same_place_waits_for_itself() -> None:
    # Why the relay exists: the same script with `Event.set` in the handler never ends.
    with pytest.raises(subprocess.TimeoutExpired):
        command = [sys.executable, "-c", SCRIPT, "plain"]
        subprocess.run(command, capture_output=True, text=True, timeout=5, check=False)


def test_each_signal_reaches_the_reaction_in_order_on_the_relay_thread() -> None:
    seen: list[tuple[int, str]] = []
    both = threading.Event()

    def react(signum: int) -> None:
        seen.append((signum, threading.current_thread().name))
        if len(seen) == 2:
            both.set()

    previous = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2)
    relay = SignalRelay(react, signals=(signal.SIGUSR1, signal.SIGUSR2)).install()
    try:
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR2)
        assert both.wait(10)
    finally:
        relay.uninstall()
    assert seen == [(signal.SIGUSR1, "signal-relay"), (signal.SIGUSR2, "signal-relay")]
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2)) == previous
    assert not any(t.name == "signal-relay" for t in threading.enumerate())


def test_a_failing_reaction_does_not_end_the_relay() -> None:
    calls: list[int] = []
    second = threading.Event()

    def react(signum: int) -> None:
        calls.append(signum)
        if len(calls) == 1:
            raise RuntimeError("the first reaction fails")
        second.set()

    relay = SignalRelay(react, signals=(signal.SIGUSR1,)).install()
    try:
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)
        assert second.wait(10)
    finally:
        relay.uninstall()
    assert calls == [signal.SIGUSR1, signal.SIGUSR1]


def test_only_the_main_thread_installs_it() -> None:
    errors: list[BaseException] = []

    def install() -> None:
        try:
            SignalRelay(lambda signum: None).install()
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join(10)
    assert len(errors) == 1
