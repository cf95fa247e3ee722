import torch.distributed as dist
import torchvision


def main():
    dist.init_process_group("gloo")
    data = torchvision.datasets.MNIST("data", download=True)  # <- script.download_every_rank
    dist.destroy_process_group()
    return data
