import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dist.destroy_process_group()


mp.spawn(worker, args=(2,), nprocs=2)  # <- script.spawn_without_main_guard
