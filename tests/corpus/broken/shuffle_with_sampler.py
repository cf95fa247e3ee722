import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def train(dataset, epochs):
    dist.init_process_group("gloo")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, shuffle=True, sampler=sampler)  # <- script.shuffle_with_sampler
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            pass
    dist.destroy_process_group()
