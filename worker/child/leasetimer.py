"""The lease's end as a kernel timer in the task child (Linux POSIX timers, via ctypes).

A thread can only notice a lapsed lease once it runs again; a stopped process (SIGSTOP,
a cgroup freeze, a starved host) runs nothing, and once thawed its task code may get
the CPU first. A POSIX timer counts in the kernel whatever the process does, and a
signal that came due while the process was stopped is delivered before the process
returns to user space when it is continued, so its handler runs before the task's next
instruction (worker/child/leasefile.py's `Watchdog` owns the handler).

The clock is CLOCK_REALTIME with an absolute expiry: the lease (`effectiveUntil`) is an
epoch time that other hosts compare with their own wall clocks, so the timer must fire
when this host's wall clock reaches it. An absolute CLOCK_REALTIME timer does so across
a clock step (NTP, settimeofday) and across a suspend of the host (the wall clock jumps
forward on resume and the timer fires then). ITIMER_REAL (CLOCK_MONOTONIC) stops during
a suspend, so it would fire late by the time slept; CLOCK_BOOTTIME counts the suspend
but drifts from the wall clock on a step. A dedicated real-time signal, not SIGALRM, so
task code that uses `signal.alarm` neither moves nor receives it.

ctypes is imported only when the timer is created (off the child's start-up path).
"""

from __future__ import annotations

import signal
from typing import Any, Final

LEASE_SIGNAL: Final = signal.SIGRTMIN + 4
_CLOCK_REALTIME: Final = 0
_TIMER_ABSTIME: Final = 1
_SIGEV_SIGNAL: Final = 0
_SIGEVENT_BYTES: Final = 64  # sizeof(struct sigevent) on Linux, every architecture


class LeaseTimer:
    """One POSIX timer of this process, firing `LEASE_SIGNAL` once at an epoch time."""

    def __init__(self, libc: Any, timer_id: Any, spec_type: Any) -> None:
        self._libc = libc
        self._timer_id = timer_id
        self._spec_type = spec_type

    @classmethod
    def create(cls, signum: int = LEASE_SIGNAL) -> LeaseTimer | None:
        """A new timer, or None where POSIX timers are not available (not Linux)."""
        try:
            import ctypes
        except ImportError:
            return None

        class Timespec(ctypes.Structure):
            _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

        class Itimerspec(ctypes.Structure):
            _fields_ = [("it_interval", Timespec), ("it_value", Timespec)]

        class Sigevent(ctypes.Structure):
            _fields_ = [
                ("sigev_value", ctypes.c_void_p),
                ("sigev_signo", ctypes.c_int),
                ("sigev_notify", ctypes.c_int),
                ("_rest", ctypes.c_byte * (_SIGEVENT_BYTES - ctypes.sizeof(ctypes.c_void_p) - 8)),
            ]

        libc = None
        for name in (None, "librt.so.1"):  # glibc >= 2.34 has them in libc itself
            try:
                candidate = ctypes.CDLL(name, use_errno=True)
                candidate.timer_create  # noqa: B018 - raises AttributeError when absent
                candidate.timer_settime  # noqa: B018
            except (OSError, AttributeError):
                continue
            libc = candidate
            break
        if libc is None:
            return None
        libc.timer_create.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        libc.timer_settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_void_p]  # fmt: skip
        event = Sigevent(sigev_signo=int(signum), sigev_notify=_SIGEV_SIGNAL)
        timer_id = ctypes.c_void_p()
        if libc.timer_create(_CLOCK_REALTIME, ctypes.byref(event), ctypes.byref(timer_id)) != 0:
            return None
        return cls(libc, timer_id, Itimerspec)

    def arm_at(self, epoch_ms: int) -> bool:
        """Fire once when the wall clock reaches `epoch_ms` (at once if it has passed).

        Re-arming replaces the previous expiry; the kernel keeps one per timer.
        """
        # An all-zero expiry would disarm the timer: a past time stays one nanosecond.
        seconds, millis = divmod(max(1, epoch_ms), 1000)
        spec = self._spec_type()
        spec.it_value.tv_sec, spec.it_value.tv_nsec = seconds, millis * 1_000_000
        import ctypes

        return int(self._libc.timer_settime(self._timer_id, _TIMER_ABSTIME,
                                            ctypes.byref(spec), None)) == 0  # fmt: skip

    def disarm(self) -> None:
        import ctypes

        spec = self._spec_type()  # all zero: disarmed
        self._libc.timer_settime(self._timer_id, 0, ctypes.byref(spec), None)
