"""A healthy job whose replicas differ between syncs by design: torch's Join over uneven inputs.

Join's tutorial form with an optimizer that is a Joinable too: DDP with ZeroRedundancyOptimizer
(SGD with momentum), `Join([model, optimizer])` around each epoch, in a trainer class. Rank r has
40 + 24r samples (10 and 16 batches an epoch): the rank out of data shadows the others'
collectives while they step on alone, and at the end of each epoch Join broadcasts the last
joiner's model. The ranks' step numbers part from the first epoch on (rank 0's step 16 is rank
1's step 22), so no digest of a due step may be compared: ddpdoctor must say nothing.
"""

import torch
import torch.distributed as dist
import torch.distributed.algorithms.join as join_mod
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


class Trainer:
    def __init__(self):
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 2))
        self.model = DDP(net)
        self.opt = ZeroRedundancyOptimizer(
            self.model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9
        )
        full = TensorDataset(torch.randn(400, 6), torch.randint(0, 2, (400,)))
        samples = 40 + 24 * self.rank  # uneven on purpose
        self.loader = DataLoader(Subset(full, range(samples)), batch_size=4, shuffle=True)

    def fit(self, epochs=4):
        crit = torch.nn.CrossEntropyLoss()
        for _epoch in range(epochs):
            with join_mod.Join([self.model, self.opt]):
                for x, y in self.loader:
                    self.opt.zero_grad()
                    crit(self.model(x), y).backward()
                    self.opt.step()
        print(f"rank {self.rank} done", flush=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    Trainer().fit()
