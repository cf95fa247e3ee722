"""Pipeline training the way DeepSpeed's pipeline tutorial writes it (DeepSpeedExamples'
pipeline/train.py): LayerSpecs, `deepspeed.add_config_arguments` with a JSON config whose
optimizer DeepSpeed builds, the training set handed to `deepspeed.initialize` and
`engine.train_batch()` with no iterator; `eval_batch()` every few steps."""

import argparse
import os
import time

import deepspeed
import torch
import torch.nn as nn
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.utils import RepeatingLoader

STEP = 0


class Block(nn.Module):
    def __init__(self, width, fault=None, fault_rank=0, fault_step=5):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.fault, self.fault_rank, self.fault_step = fault, fault_rank, fault_step

    def forward(self, x):
        if self.fault and STEP == self.fault_step and torch.distributed.get_rank() == self.fault_rank:
            if self.fault == "stall":
                time.sleep(3600)
            else:
                raise RuntimeError("block: activations went NaN")
        return torch.relu(self.fc(x))


def get_args():
    parser = argparse.ArgumentParser(description="pipeline tutorial")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("-s", "--steps", type=int, default=12, help="quit after this many steps")
    parser.add_argument("-p", "--pipeline-parallel-size", type=int, default=2, help="pipeline parallelism")
    parser.add_argument("--backend", type=str, default="gloo", help="distributed backend")
    parser.add_argument("--seed", type=int, default=1138, help="PRNG seed")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--fault", choices=["stall", "raise"], default=None)
    parser.add_argument("--fault-rank", type=int, default=0)
    parser.add_argument("--fault-step", type=int, default=5)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def random_set(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def train_pipe(args, part="parameters"):
    torch.manual_seed(args.seed)
    deepspeed.runtime.utils.set_random_seed(args.seed)

    fault = dict(fault=args.fault, fault_rank=args.fault_rank, fault_step=args.fault_step)
    layers = [
        LayerSpec(nn.Linear, 32, 64),
        LayerSpec(Block, 64, **fault),
        LayerSpec(Block, 64),
        LayerSpec(Block, 64),
        LayerSpec(Block, 64),
        LayerSpec(nn.Linear, 64, 10),
    ]
    net = PipelineModule(
        layers=layers,
        loss_fn=torch.nn.CrossEntropyLoss(),
        num_stages=args.pipeline_parallel_size,
        partition_method=part,
        activation_checkpoint_interval=0,
    )

    trainset = random_set(2048, args.seed)
    engine, _, _, _ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=trainset,
    )
    evalset = random_set(256, args.seed + 1)
    eval_iter = RepeatingLoader(
        torch.utils.data.DataLoader(evalset, batch_size=engine.train_micro_batch_size_per_gpu())
    )

    global STEP
    for step in range(args.steps):
        STEP = step
        loss = engine.train_batch()
        if args.eval_every and (step + 1) % args.eval_every == 0:
            eval_loss = engine.eval_batch(eval_iter)
            if engine.global_rank == 0:
                print(f"step {step}: eval loss {eval_loss}", flush=True)


if __name__ == "__main__":
    args = get_args()

    deepspeed.init_distributed(dist_backend=args.backend)
    args.local_rank = int(os.environ["LOCAL_RANK"])
    train_pipe(args)
