import torch.distributed as dist


def main():
    dist.init_process_group("gloo", world_size=2, rank=0)  # <- script.init_hardcoded_rank
    dist.destroy_process_group()
