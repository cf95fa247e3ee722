"""An mp.spawn script whose 2 ranks join a process group, pass a barrier, then wait forever (a
long training run, as far as a watcher can tell). For the test that kills `ddpdoctor run`.

    python spawn_sleepers.py PORT
"""

import sys
import time

import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dist.barrier()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    mp.spawn(work, args=(int(sys.argv[1]),), nprocs=2)
