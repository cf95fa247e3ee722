"""ZeRO-3 with a deeper model, in a third style: the engine made in a helper, its config tuned
so that each layer is gathered on its own (no prefetch bucket), so every step makes a dozen
all-gathers of one size (14 calls a step, more than a poll's window of a rank's latest calls);
rank 0 alone samples from the model every N steps, the way a script shows a `generate()` under
`if rank == 0:`.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 ds_zero_deep.py --steps 24 --sample-every 8

The sampling forward's all-gathers pair with rank 1's training all-gathers of the same size
(the ranks are back in step a step later: the sampling left the parameters gathered); sampling
at the last step, rank 0 waits for rank 1, which has finished.
"""

import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
import torch.distributed as dist

WIDTH, DEPTH = 32, 12


def build_engine(depth: int):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    zero = {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,  # every layer partitioned, however small
        "stage3_prefetch_bucket_size": 0,  # ... and gathered on its own
    }
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


@torch.no_grad()
def sample(engine, tokens: int = 1) -> torch.Tensor:
    x = torch.zeros(1, WIDTH)
    for _ in range(tokens):
        x = engine(x)  # every forward gathers each layer's parameters again
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--sample-every", type=int, default=0)
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    engine = build_engine(DEPTH)
    for step in range(1, args.steps + 1):
        batch = torch.randn(4, WIDTH)
        loss = engine(batch).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if args.sample_every and step % args.sample_every == 0 and dist.get_rank() == 0:
            print(f"step {step}: sample norm {sample(engine).norm():.3f}", flush=True)


if __name__ == "__main__":
    main()
