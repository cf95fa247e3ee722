"""An elastic trainer whose rank dies without a Python error once (SIGKILL or os._exit).

Written for ddpdoctor's recovery corpus in another style than raise_once.py: a loop at module
level under a main guard, the restart count read through torch's elastic helper variables, and a
rank that ends itself with `os.kill(os.getpid(), SIGKILL)` (or `os._exit(3)` with `--exit`) at
`--fail-step` (6 unless given) of the first attempt. torchrun's `--max-restarts` starts the ranks again.

    torchrun --nproc-per-node 2 --max-restarts 1 --rdzv-backend c10d \
        --rdzv-endpoint localhost:PORT kill_self_once.py [--exit] [--always] [--fail-step N]
"""

import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn

STEPS = 16
FAIL_STEP = 6

if __name__ == "__main__":
    use_exit = "--exit" in sys.argv
    always = "--always" in sys.argv
    if "--fail-step" in sys.argv:  # -1: as soon as it has joined
        FAIL_STEP = int(sys.argv[sys.argv.index("--fail-step") + 1])
    restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group(backend="gloo")
    if FAIL_STEP < 0 and dist.get_rank() == 1 and (always or restarts == 0):
        os.kill(os.getpid(), signal.SIGKILL)  # -1: as soon as it has joined
    net = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    for i in range(STEPS):
        if dist.get_rank() == 1 and i == FAIL_STEP and (always or restarts == 0):
            if use_exit:
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        out = net(torch.ones(4, 8) * i)
        out.sum().backward()
        sgd.step()
        sgd.zero_grad()
    dist.destroy_process_group()
