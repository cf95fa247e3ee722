"""torchft without its wrappers: the Manager driven by hand (start_quorum, allreduce of each
gradient, should_commit), its ProcessGroupGloo built in a helper, the replica group from the
script's own flag. MODE as in train_ddp.py: healthy | sigkill | stall.
"""

import argparse
import datetime
import os
import signal
import time

import torch
import torch.nn.functional as F
import torchft


def build_manager(group: int, model: torch.nn.Module, opt: torch.optim.Optimizer):
    def save():
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    def load(state):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])

    return torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=datetime.timedelta(seconds=10)),
        min_replica_size=2,  # commit only with both replica groups in the step
        load_state_dict=load,
        state_dict=save,
        replica_id=f"replica{group}",
        timeout=datetime.timedelta(seconds=30),
    )


def sync_gradients(manager, model):
    works = [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]
    for work in works:
        work.wait()


def train(args):
    model = torch.nn.Linear(20, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    manager = build_manager(args.group, model, opt)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    for step in range(1, 1_000_000):  # this process's steps
        manager.start_quorum()
        opt.zero_grad()
        x = torch.randn(16, 20)
        loss = F.cross_entropy(model(x), (x.sum(1) > 0).long())
        loss.backward()
        if args.mode == "sigkill" and args.group == 1 and step == 10 and not restarted:
            os.kill(os.getpid(), signal.SIGKILL)  # planted fault
        if args.mode == "stall" and args.group == 1 and step == 5:
            while True:
                time.sleep(1)  # planted fault
        sync_gradients(manager, model)
        if manager.should_commit():
            opt.step()
        time.sleep(0.05)
        if manager.current_step() >= args.steps:
            break
        if manager.current_step() >= 50 * args.steps:
            break
    print(f"group {args.group}: finished at step {manager.current_step()}")
    manager.shutdown(wait=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="healthy")
    parser.add_argument("--group", type=int, default=int(os.environ.get("REPLICA_GROUP_ID", 0)))
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", 30)))
    train(parser.parse_args())
