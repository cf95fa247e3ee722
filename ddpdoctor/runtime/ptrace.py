"""Let py-spy read this rank's stacks without root.

Ubuntu and most distributions ship Yama with `kernel.yama.ptrace_scope=1`: a process may ptrace
only its own descendants, so `py-spy dump --pid <rank>` run by the same user from another shell
(or by `ddpdoctor run`, which did not start the rank itself: torchrun did) is refused. A process
can name who may trace it: `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)` lets any process of the
same user attach (other users still need the usual permissions, root still can). Where Yama is
absent the call fails with EINVAL and nothing is needed; every failure is ignored.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

# <linux/prctl.h>: PR_SET_PTRACER is 0x59616d61 ("Yama"); PR_SET_PTRACER_ANY is ((unsigned long)-1)
PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def allow_any_tracer() -> bool:
    """Allow processes of this user to ptrace this one (Linux); True when the kernel agreed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = _libc().prctl
        prctl.argtypes = (
            ctypes.c_int,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
        )
        prctl.restype = ctypes.c_int
        return prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0
    except Exception:  # noqa: BLE001 - no libc, no prctl: py-spy may still work as root
        return False
