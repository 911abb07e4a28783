"""Keep a task's agent away from the worker: its memory, environment and credentials.

An agent with the Bash tool runs whatever the model says, and the model reads untrusted
task input. Two layers stand between it and the worker's AWS credentials:

- The worker makes itself non-dumpable at start-up (`forbid_inspection`). Its
  /proc/<pid>/environ, mem, fd/ and maps then belong to root, so a child running as the
  worker's own (non-root) user cannot read ``AWS_CONTAINER_CREDENTIALS_*`` from them,
  nor attach a debugger. Root can read any process regardless.
- A worker running as root runs each child as `CHILD_USER` (`ChildUser`), an
  unprivileged user: the child cannot read the worker's /proc entries or files, nor
  signal it. The task dir and the CLI's HOME are handed to that user.

Neither layer hides the child's own environment (the Anthropic key it needs) from it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agentq.errors import ConfigError

logger = logging.getLogger(__name__)
_PR_SET_DUMPABLE: Final = 4
_PR_GET_DUMPABLE: Final = 3


def forbid_inspection() -> bool:
    """prctl(PR_SET_DUMPABLE, 0); False where the platform has no prctl (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        logger.warning("prctl unavailable: the worker stays inspectable by its own user")
        return False
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_DUMPABLE) failed", extra={"errno": ctypes.get_errno()})
        return False
    return True


def is_dumpable() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))


@dataclass(frozen=True, kw_only=True)
class ChildUser:
    """Who a task child runs as, when not as the worker itself."""

    name: str
    uid: int
    gid: int

    @classmethod
    def resolve(cls, name: str | None) -> ChildUser | None:
        """The configured `CHILD_USER`, checked at start-up; None to run as the worker."""
        if not name:
            return None
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ConfigError("CHILD_USER", f"= {name!r} is no user on this host: create it "
                              "(the worker image has agentq-task) or unset it") from None  # fmt: skip
        if entry.pw_uid == 0:
            raise ConfigError("CHILD_USER", f"= {name!r} is root: name an unprivileged user")
        if os.geteuid() != 0:
            raise ConfigError("CHILD_USER", "needs a worker running as root to switch users: "
                              "unset it (the worker is non-dumpable either way) or run as root")  # fmt: skip
        return cls(name=name, uid=entry.pw_uid, gid=entry.pw_gid)

    def popen_options(self) -> dict[str, Any]:
        # No supplementary groups: the child must not keep the worker's (root's) groups.
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def hand_over(self, path: Path) -> None:
        """Give the child `path` (a task dir or the CLI's HOME) and what is inside it."""
        os.chown(path, self.uid, self.gid)
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)


def popen_options(user: ChildUser | None) -> dict[str, Any]:
    return user.popen_options() if user is not None else {}
