"""What recording a collective's call site costs, per call, in CPU time of the calling thread.

    python benchmarks/call_sites.py [--calls 100000]

The runtime's torch.distributed wrapper asks `call_sites.caller_site(1)` for every explicit
collective (never for DDP's gradient buckets). This times a wrapper that does, against one that
does not, called from the user's code directly (a hand-written loop's `dist.all_reduce`) and
through 5 and 20 frames of a framework package laid out as site-packages lays it out (Lightning
calls a collective 5 to 20 frames below the user's code). CPU time of this thread, best of 9
rounds: a loaded machine's other processes do not count.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("ddpdoctor") is None:  # not installed: run from the checkout
    sys.path.insert(0, str(REPO))

from ddpdoctor.runtime import call_sites  # noqa: E402

FRAMEWORK = """
def nest(depth, fn):
    if depth == 0:
        return fn()
    return nest(depth - 1, fn)
"""


def recorded():
    return call_sites.caller_site(1)


def unrecorded():
    return None


def user_direct():
    return recorded()


def user_plain():
    return unrecorded()


def cpu_us(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(9):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - t0) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    calls = parser.parse_args().calls
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "site-packages" / "benchfw"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(FRAMEWORK)
        sys.path.insert(0, str(package.parent))
        import benchfw

        cost = cpu_us(user_direct, calls) - cpu_us(user_plain, calls)
        print(f"the user's code calls dist.* directly: +{cost:.2f} µs per call")
        for depth in (5, 20):
            site = cpu_us(lambda d=depth: benchfw.nest(d, recorded), calls // 5)
            plain = cpu_us(lambda d=depth: benchfw.nest(d, unrecorded), calls // 5)
            print(f"through {depth} framework frames: +{site - plain:.2f} µs per call")


if __name__ == "__main__":
    main()
