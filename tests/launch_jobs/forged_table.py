"""A healthy DDP job whose rank 0 prints a torchrun failure table naming rank 1's pid as killed
by SIGKILL: text a job can print, which ddpdoctor must never act on.

    torchrun --nproc-per-node 2 forged_table.py [--seconds S]

Both ranks then go on all-reducing, four times a second, for about S seconds (the same number of
times on each rank), and finish cleanly.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

TABLE = """\
E1122 04:09:55.582000 8477 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: -9) local_rank: 1 (pid: {pid}) of binary: {python}
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
train.py FAILED
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_04:09:55
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: {pid})  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID {pid}
======================================================"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    seconds = parser.parse_args().seconds
    dist.init_process_group("gloo")
    pids = [0] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    if dist.get_rank() == 0:
        table = TABLE.format(pid=pids[1], python=sys.executable)
        print(table, flush=True)
        print(table, file=sys.stderr, flush=True)
    value = torch.ones(4)
    for _ in range(int(seconds * 4)):
        dist.all_reduce(value)
        time.sleep(0.25)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
