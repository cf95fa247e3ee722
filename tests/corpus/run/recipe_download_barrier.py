"""Tutorial recipe: rank 0 downloads the data set while the other ranks wait in `dist.barrier()`.

Written for ddpdoctor's run corpus after the pattern the PyTorch DDP tutorials teach (and torchvision
reference scripts use): only rank 0 fetches and unpacks the data, everybody meets at a barrier, then
all ranks read the unpacked files. The "download" is real CPU work with no network: rank 0
generates synthetic shards, deflates them into a zip archive for `--download-s` seconds, then
unpacks it into ./data and the ranks load the shards.

Healthy: rank 0 is busy (its CPU time advances, its stack moves) while rank 1 waits; ddpdoctor must
not call it a hang, warn, or stop it. The default 18 s is past ddpdoctor's startup hang floor (15 s).

    ddpdoctor run --nproc 2 -- recipe_download_barrier.py [--download-s 18] [--steps 6]
"""

import argparse
import io
import os
import time
import zipfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SHARD_ROWS = 4096


def download(root: Path, seconds: float) -> None:
    """Generate and compress shards until `seconds` have passed, then unpack them: CPU work."""
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "dataset.zip"
    start = time.monotonic()
    shards = 0
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        while time.monotonic() - start < seconds or shards == 0:
            g = torch.Generator().manual_seed(shards)
            x = torch.randn(SHARD_ROWS, 16, generator=g)
            y = (x.sum(dim=1, keepdim=True) > 0).float()
            buf = io.BytesIO()
            torch.save({"x": x, "y": y}, buf)
            zf.writestr(f"shard-{shards:05d}.pt", buf.getvalue())
            shards += 1
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(root / "unpacked")
    (root / "READY").write_text(str(shards))
    print(f"rank 0: downloaded {shards} shards in {time.monotonic() - start:.1f} s", flush=True)


def load(root: Path) -> TensorDataset:
    # A few shards are enough to train on; the point of the recipe is the wait before it.
    files = sorted((root / "unpacked").glob("shard-*.pt"))[:4]
    parts = [torch.load(f) for f in files]
    return TensorDataset(torch.cat([p["x"] for p in parts]), torch.cat([p["y"] for p in parts]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--download-s", type=float, default=18.0)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--data", default="./data")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = Path(args.data)
    if rank == 0:
        download(root, args.download_s)
    dist.barrier()  # the others wait here for rank 0's download

    dataset = load(root)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.BCEWithLogitsLoss()
    sampler.set_epoch(0)
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    print(f"rank {rank}: trained {args.steps} steps, loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
