"""Named moments of a run where the kill and full-disk tests stop it (`crash_point`)."""

from __future__ import annotations

import errno
import os
import signal

CRASH_ENV = "XLNET_LITE_CRASH_AT"
DISK_FULL_ENV = "XLNET_LITE_DISK_FULL_AT"
_crash_counts: dict[tuple[str, str], int] = {}


def crash_point(name: str):
    """A named moment of a run where the kill tests stop it. With XLNET_LITE_CRASH_AT=name or name@n in the
    environment the process SIGKILLs itself the n-th time (default: the first) it passes `name`; with
    XLNET_LITE_DISK_FULL_AT=name or name@n it raises OSError(ENOSPC) there instead, as a full disk would; otherwise
    nothing."""
    for env in (CRASH_ENV, DISK_FULL_ENV):
        spec = os.environ.get(env)
        if not spec or spec.partition("@")[0] != name:
            continue
        key = (env, name)
        _crash_counts[key] = _crash_counts.get(key, 0) + 1
        if _crash_counts[key] != int(spec.partition("@")[2] or 1):
            continue
        if env == CRASH_ENV:
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
