"""A small transformer sharded with FSDP2 the way the FSDP2 tutorial does it, embedding and
output projection left to the root. Planted fault: rank 1 alone also shards the output
projection (`fully_shard` imported at module level, before the process group exists).

    ddpdoctor run --nproc 2 -- fsdp_extra_wrap.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

VOCAB, DIM = 64, 32


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, h):
        h = h + self.attn(h)
        return h + self.mlp(h)


class TinyLM(nn.Module):
    def __init__(self, n_layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Layer() for _ in range(n_layers)])
        self.output = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(h)


def shard(model, mesh):
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    if int(os.environ["RANK"]) == 1:
        fully_shard(model.output, mesh=mesh)  # planted fault: only rank 1 shards the output
    fully_shard(model, mesh=mesh)
    return model


def main():
    dist.init_process_group(backend="gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = shard(TinyLM(), mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(20):
        tokens = torch.randint(0, VOCAB, (4, 16))
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        optim.step()
        optim.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
