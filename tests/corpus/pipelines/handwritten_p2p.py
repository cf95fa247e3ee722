"""A two-stage pipeline written by hand, as Megatron-style training loops do it: stage 0 sends
its activations with dist.send, stage 1 receives them with dist.recv, computes the loss and
sends the gradient back; the loss is averaged with an all_reduce for logging.

    torchrun --nproc-per-node 2 handwritten_p2p.py [--fault stall|skip-recv|crossed] [--at S]

Faults at step --at: `stall` (stage 1 blocks on a lock that is never released before its
receive), `skip-recv` (stage 1 skips its receive of the activations and goes on to the loss
all_reduce: stage 0's send is never received), `crossed` (both stages receive first: each
waits for the other).
"""

import argparse
import threading

import torch
import torch.distributed as dist
from torch import nn

FEATURES = 16


def make_stage(rank: int) -> nn.Module:
    torch.manual_seed(rank)
    if rank == 0:
        return nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.Tanh())
    return nn.Linear(FEATURES, 1)


def first_stage(model, opt, x, step, fault):
    act = model(x)
    if fault == "crossed":
        grad = torch.empty_like(act)
        dist.recv(grad, src=1)  # waits for stage 1, which waits for us
    dist.send(act.detach(), dst=1)
    grad = torch.empty_like(act)
    dist.recv(grad, src=1)
    opt.zero_grad()
    act.backward(grad)
    opt.step()
    return torch.zeros(())


def last_stage(model, opt, y, step, fault, lock):
    act = torch.empty(y.shape[0], FEATURES)
    if fault == "stall":
        lock.acquire()  # never released: the stage blocks here
    if fault == "crossed":
        dist.recv(act, src=0)
    if fault != "skip-recv":
        dist.recv(act, src=0)
    act.requires_grad_(True)
    loss = nn.functional.mse_loss(model(act), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if fault != "skip-recv":
        dist.send(act.grad, dst=0)
    return loss.detach()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--fault", choices=["stall", "skip-recv", "crossed"])
    ap.add_argument("--at", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    model = make_stage(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    lock = threading.Lock()
    lock.acquire()
    for step in range(args.steps):
        x, y = torch.randn(8, FEATURES), torch.randn(8, 1)
        fault = args.fault if step == args.at else None
        if rank == 0:
            loss = first_stage(model, opt, x, step, fault)
        else:
            loss = last_stage(model, opt, y, step, fault, lock)
        dist.all_reduce(loss)  # the loss, for logging
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
