"""DeepSpeed in another style: the config in a JSON file handed with `--deepspeed_config`
(deepspeed.add_config_arguments), the engine's own DataLoader (`training_data=`), `deepspeed.comm`
for ranks, the step in a helper function and a validation pass on rank 0 alone.

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 ds_regression.py --deepspeed_config ds_config.json
    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 ds_regression.py --deepspeed_config ...

`--zero N` overrides the config's ZeRO stage. `--validate-every N`: rank 0 alone validates.
Faults on rank 1 at step --fault-step: `stall` (waits on a file that never appears), `raise`
(a batch check fails).
"""

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
from deepspeed import comm as dist
from torch.utils.data import TensorDataset


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48), torch.nn.Tanh(),
        torch.nn.Linear(48, 1),
    )  # fmt: skip


def wait_for_shard(path: Path) -> None:
    while not path.exists():  # a shard another process was meant to write
        time.sleep(0.5)


def check_batch(x: torch.Tensor, step: int, fault: str | None, fault_step: int) -> None:
    if fault == "raise" and step == fault_step and dist.get_rank() == 1:
        raise ValueError(f"batch {step}: non-finite features")


def train_step(engine, batch, step: int, args) -> float:
    x, y = batch
    check_batch(x, step, args.fault, args.fault_step)
    if args.fault == "stall" and step == args.fault_step and dist.get_rank() == 1:
        wait_for_shard(Path("/nonexistent/shard-%d.pt" % step))
    pred = engine(x)
    loss = torch.nn.functional.mse_loss(pred, y)
    engine.backward(loss)
    engine.step()
    return loss.item()


@torch.no_grad()
def validate(engine, batches) -> float:
    engine.eval()
    total = sum(torch.nn.functional.mse_loss(engine(x), y).item() for x, y in batches)
    engine.train()
    return total / len(batches)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="regression under ZeRO")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--zero", type=int, default=None)
    parser.add_argument("--validate-every", type=int, default=0)
    parser.add_argument("--fault", choices=["stall", "raise"], default=None)
    parser.add_argument("--fault-step", type=int, default=4)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    config = json.loads(Path(args.deepspeed_config).read_text())
    if args.zero is not None:
        config["zero_optimization"]["stage"] = args.zero
    args.deepspeed_config = None  # the dict below is the config
    torch.manual_seed(1234)
    features = torch.randn(256, 16)
    data = TensorDataset(features, features.sum(dim=1, keepdim=True))
    model = make_model()
    engine, _, loader, _ = deepspeed.initialize(
        args=args, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        training_data=data, config=config,
    )  # fmt: skip
    held_out = [(torch.randn(4, 16), torch.zeros(4, 1)) for _ in range(2)]
    batches = iter(loader)
    for step in range(1, args.steps + 1):
        loss = train_step(engine, next(batches), step, args)
        if args.validate_every and step % args.validate_every == 0:
            if dist.get_rank() == 0:
                print(f"step {step}: loss {loss:.4f} val {validate(engine, held_out):.4f}")
    print(f"rank {dist.get_rank()} finished", flush=True)


if __name__ == "__main__":
    main()
