"""A GPT-style pipeline the way Megatron-DeepSpeed writes one: a PipelineModule subclass over a
plain list of layers (a function, tied embedding / output-head `TiedLayerSpec`s), an explicit
pipe x data topology, a dict config, an AdamW object handed to `deepspeed.initialize`, a
`RepeatingLoader(DataLoader)` iterator passed to `train_batch`, a cross-entropy `loss_fn` of its
own and an `evaluate()` of a few `eval_batch` calls every `--eval-interval` iterations."""

import argparse
import os
import time

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
from deepspeed.utils import RepeatingLoader
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

VOCAB, SEQ, HIDDEN = 128, 16, 64
FAULT = {"kind": None, "rank": -1, "iteration": -1}
ITERATION = 0


def _fault_here() -> bool:
    return FAULT["kind"] is not None and ITERATION == FAULT["iteration"] and dist.get_rank() == FAULT["rank"]


def cross_entropy(logits, labels):
    if _fault_here():
        if FAULT["kind"] == "stall":
            time.sleep(3600)
        raise ValueError(f"labels out of range at iteration {ITERATION}")
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


class EmbeddingPipe(nn.Module):
    def __init__(self, vocab_size, hidden_size):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings = nn.Embedding(SEQ, hidden_size)

    @property
    def word_embeddings_weight(self):
        return self.word_embeddings.weight

    def forward(self, input_ids):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        return self.word_embeddings(input_ids) + self.position_embeddings(positions)


class TransformerLayerPipe(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, 4 * hidden_size), nn.GELU(), nn.Linear(4 * hidden_size, hidden_size))

    def forward(self, hidden_states):
        return hidden_states + self.mlp(self.norm(hidden_states))


def _logits_helper(embedding, lm_output):
    return lm_output @ embedding.word_embeddings_weight.t()


class GPTModelPipe(PipelineModule):
    def __init__(self, num_layers, topology):
        self.specs = []
        self.specs.append(lambda ids: ids.long())
        self.specs.append(TiedLayerSpec("embed", EmbeddingPipe, VOCAB, HIDDEN, tied_weight_attr="word_embeddings_weight"))
        for _ in range(num_layers):
            self.specs.append(LayerSpec(TransformerLayerPipe, HIDDEN))
        self.specs.append(LayerSpec(nn.LayerNorm, HIDDEN))
        self.specs.append(
            TiedLayerSpec("embed", EmbeddingPipe, VOCAB, HIDDEN, forward_fn=_logits_helper, tied_weight_attr="word_embeddings_weight")
        )
        super().__init__(layers=self.specs, loss_fn=cross_entropy, topology=topology, partition_method="uniform")


class TokenDataset(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i, :-1], self.tokens[i, 1:]


def build_iterator(dataset, engine, shuffle):
    sampler = DistributedSampler(
        dataset, num_replicas=engine.grid.get_data_parallel_world_size(), rank=engine.grid.get_data_parallel_rank(), shuffle=shuffle
    )
    loader = DataLoader(dataset, batch_size=engine.train_micro_batch_size_per_gpu(), sampler=sampler, drop_last=True)
    return iter(RepeatingLoader(loader))


def evaluate(model, data_iterator, eval_iters):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for _ in range(eval_iters):
            total += float(model.eval_batch(data_iterator))
    model.train()
    return total / eval_iters


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--train-iters", type=int, default=12)
    parser.add_argument("--eval-interval", type=int, default=5)
    parser.add_argument("--eval-iters", type=int, default=2)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=2)
    parser.add_argument("--fault", choices=["stall", "raise"])
    parser.add_argument("--fault-rank", type=int, default=-1, help="default: the last rank (last stage)")
    parser.add_argument("--fault-iteration", type=int, default=6)
    return parser.parse_args()


def main():
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    world = dist.get_world_size()
    FAULT.update(kind=args.fault, rank=args.fault_rank if args.fault_rank >= 0 else world - 1, iteration=args.fault_iteration)

    pp = args.pipeline_model_parallel_size
    topology = PipeDataParallelTopology(num_pp=pp, num_dp=world // pp)
    model = GPTModelPipe(args.num_layers, topology)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    ds_config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "wall_clock_breakdown": False,
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

    train_data_iterator = build_iterator(TokenDataset(1024, 1234), engine, shuffle=True)
    valid_data_iterator = build_iterator(TokenDataset(128, 4321), engine, shuffle=False)

    global ITERATION
    while ITERATION < args.train_iters:
        loss = engine.train_batch(data_iter=train_data_iterator)
        ITERATION += 1
        if args.eval_interval and ITERATION % args.eval_interval == 0:
            val_loss = evaluate(engine, valid_data_iterator, args.eval_iters)
            if dist.get_rank() == 0:
                print(f"iteration {ITERATION}: lm loss {float(loss):.4f} validation loss {val_loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
