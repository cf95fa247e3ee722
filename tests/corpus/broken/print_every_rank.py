import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    print("starting")  # <- script.print_every_rank
    print("more")
    dist.destroy_process_group()
