"""A job whose rank on host h2 prepares slowly before the process group forms (a dataset fetched
on that host only), in the plainest style: everything at module level. The other hosts' ranks
wait in init_process_group meanwhile. For the lab's start-up loss (test_lab_host_lost.py)."""

import os
import socket
import time

import torch
import torch.distributed as dist

if socket.gethostname() == os.environ.get("SLOW_HOST", "h2"):
    time.sleep(float(os.environ.get("SLOW_S", "120")))  # "downloading the shards"
dist.init_process_group("gloo")
x = torch.ones(4)
for _step in range(int(os.environ.get("STEPS", "20"))):
    dist.all_reduce(x)
    time.sleep(0.1)
dist.destroy_process_group()
