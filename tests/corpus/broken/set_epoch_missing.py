import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def train(dataset, model, epochs):
    dist.init_process_group("gloo")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    for epoch in range(epochs):  # <- script.set_epoch_missing
        for x, y in loader:
            model(x).sum().backward()
    dist.destroy_process_group()
