"""Faulty on purpose: rank 0 blocks on a queue that is never filled while rank 1 waits in a barrier.

Written for ddpdoctor's run corpus, the blocked counterpart of recipe_eval_checkpoint.py: after each
epoch rank 0 hands its checkpoint to a background uploader thread and waits for the upload's
receipt with `queue.get()`. The uploader dies on its first upload (an exception in a thread only
prints a traceback), so the receipt never comes: rank 0 sleeps in `queue.get()` forever, its CPU
time flat, while rank 1 waits in the end-of-epoch `dist.barrier()`.

What is wrong: a blocking wait with no timeout on work that can fail silently.
How it shows: HANG, culprit rank 0 (blocked, not busy): its stack in `queue.get`.
How to fix: `queue.get(timeout=...)`, and re-raise the worker's exception in the main thread.

    ddpdoctor run --nproc 2 -- faulty/rank0_blocked_on_queue.py
"""

import queue
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def upload(state: dict) -> None:
    raise ConnectionError(f"upload of {len(state)} tensors refused: 403 Forbidden")


def uploader(jobs: "queue.Queue[dict]", receipts: "queue.Queue[str]") -> None:
    while True:
        state = jobs.get()
        upload(state)  # raises: the thread dies and no receipt is ever put
        receipts.put("ok")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    jobs: queue.Queue = queue.Queue()
    receipts: queue.Queue = queue.Queue()
    if rank == 0:
        threading.Thread(target=uploader, args=(jobs, receipts), daemon=True).start()
    for epoch in range(3):
        for _ in range(10):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        if rank == 0:
            jobs.put(model.module.state_dict())
            receipts.get()  # blocks forever: the uploader died
        dist.barrier()
        print(f"rank {rank}: epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
