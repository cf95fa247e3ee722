"""A job whose SIGTERM handler runs one more collective, as Lightning's does while a job is being
stopped, with a hang planted on one rank (env:// ranks: run it under torchrun).

    python sigterm_collective.py [--hang-rank R] [--hang-step S] [--steps N]

Each step all-reduces a tensor; rank R, at step S, sleeps forever before its all-reduce, so the
other ranks wait in it. On SIGTERM every rank calls a barrier and then exits 143: the rank that
hung enters a barrier where the others are in an all_reduce, which read anew is a mismatch.
"""

import argparse
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang-rank", type=int, default=1)
    parser.add_argument("--hang-step", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    a = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def on_sigterm(signum, frame):
        # the framework's teardown collective (bounded, so that the stop does not wait on it)
        dist.monitored_barrier(timeout=timedelta(seconds=3))
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    value = torch.ones(4)
    for step in range(a.steps):
        if rank == a.hang_rank and step == a.hang_step:
            while True:
                time.sleep(1)
        dist.all_reduce(value)
        value /= dist.get_world_size()
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
