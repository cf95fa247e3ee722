"""The reference job itself: init, data, model, the training loop, checkpoint, evaluation, checks.

Runs in every rank under torchrun. `ddpdoctor.runtime.activate()` instruments the process when
ddpdoctor launched it ($DDPDOCTOR_RUN_DIR set) and does nothing under plain torchrun, so the same job
measures the instrumentation's cost. The runtime records DDP gradient buckets, collectives, steps
(DDP forwards, with their timings), data waits and the sampler audit; the job adds its loss per step
(`api.log`), its phases, its injected faults and the final parameter check.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ddpdoctor.console import error_line
from ddpdoctor.errors import UsageError
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.protocol.rundir import ENV_RUN_DIR
from ddpdoctor.reference.config import ReferenceConfig, parse_config
from ddpdoctor.reference.data import (
    SyntheticSpec,
    cache_dir,
    load_cifar10,
    load_synthetic,
    prepare_synthetic,
)
from ddpdoctor.reference.faults import FaultHooks, FaultInjector
from ddpdoctor.reference.model import build_model, parameter_count
from ddpdoctor.reference.verify import (
    check_parameters,
    checkpoint_dir,
    evaluate,
    remove_checkpoint_dir,
    save_checkpoint,
)

GLOO_RELEASE_GRACE_S = 0.2
WARMUP_STEPS = 3  # the first steps build DDP's buckets; steady-state speed is measured after them


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: Any
    on_gpu: bool


@dataclass(frozen=True)
class LoopResult:
    steps: int
    epochs: int
    seconds: float
    steady_seconds: float  # after WARMUP_STEPS
    steady_cpu_seconds: float  # this process's CPU time (all its threads) after WARMUP_STEPS
    last_loss: float

    @property
    def steady_steps_per_s(self) -> float:
        steady = self.steps - WARMUP_STEPS
        return steady / self.steady_seconds if steady > 0 and self.steady_seconds > 0 else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = parse_config(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(error_line(str(exc)), file=sys.stderr)
        return int(ExitCode.USAGE)

    from ddpdoctor.runtime import activate, api

    activate()
    api.phase("init")
    try:
        ctx = setup_distributed(cfg)
    except UsageError as exc:
        print(error_line(str(exc)), file=sys.stderr)
        return int(ExitCode.USAGE)
    import torch.distributed as dist

    try:
        code = run(cfg, ctx, api)
    except UsageError as exc:  # every rank finds the same mistake: each exits with one line
        print(error_line(str(exc)), file=sys.stderr)
        return int(ExitCode.USAGE)
    # Only on the way out of a finished job: tearing a group down while peers may still be inside
    # a collective (after an exception) can hang on NCCL, so failures leave that to the exit.
    api.phase("shutdown")
    release_process_group(dist)
    return code


def release_process_group(dist: Any) -> None:
    """Tear the process group down so that the process can exit cleanly.

    gloo's worker threads release a finished collective (its tensors and captured Python state)
    a moment after `wait()` has returned in Python. If that happens while the interpreter is
    shutting down, the thread cannot take the GIL and the process dies with "terminate called
    without an active exception" (SIGABRT) after a run that succeeded (observed with torch 2.14
    in a few percent of runs). A final barrier and a short pause give the threads that moment
    while Python is still fully alive.
    """
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
    time.sleep(GLOO_RELEASE_GRACE_S)


def setup_distributed(cfg: ReferenceConfig) -> DistContext:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = cfg.backend != "gloo" and torch.cuda.is_available()
    backend = cfg.backend_for(on_gpu)
    if backend == "nccl" and not on_gpu:
        raise UsageError("--backend nccl needs a CUDA GPU; none is visible to this rank")
    if on_gpu:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend, init_method="env://")
    return DistContext(
        rank=dist.get_rank(),
        local_rank=local_rank,
        world_size=dist.get_world_size(),
        backend=backend,
        device=device,
        on_gpu=on_gpu,
    )


def run(cfg: ReferenceConfig, ctx: DistContext, api: Any) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    api.phase("data")
    train_set, test_set, data_note = prepare_data(cfg, ctx)

    torch.manual_seed(cfg.seed)  # identical initial weights everywhere (DDP also broadcasts them)
    model_name = cfg.model_for(ctx.on_gpu)
    model = build_model(model_name, sync_batchnorm=ctx.on_gpu and ctx.world_size > 1)
    model = model.to(ctx.device)
    ddp = DDP(model, device_ids=[ctx.local_rank] if ctx.on_gpu else None)
    if ctx.rank == 0:
        print(
            f"ddpdoctor reference job: {ctx.world_size} ranks, {ctx.backend} on "
            f"{'cuda' if ctx.on_gpu else 'cpu'}, {model_name} "
            f"({parameter_count(model) / 1000:.0f}k parameters), {data_note}, "
            f"batch {cfg.batch_size} per rank, {cfg.steps} steps",
            flush=True,
        )

    injector = FaultInjector(
        cfg.injects,
        ctx.rank,
        FaultHooks(record=api.fault, extra_collective=dist.barrier),
    )
    api.phase("train")
    loop = train_loop(cfg, ctx, ddp, train_set, injector, api)
    if ctx.rank == 0:
        print(
            f"train loop: {loop.steps} steps in {loop.seconds:.3f} s "
            f"({loop.steps / loop.seconds:.1f} steps/s; "
            f"{loop.steady_steps_per_s:.1f} steps/s after warm-up, "
            f"{loop.steady_cpu_seconds:.3f} s of CPU on rank 0)",
            flush=True,
        )
    api.log(
        train_loop_s=round(loop.seconds, 4),
        steady_steps_per_s=round(loop.steady_steps_per_s, 3),
        steps=loop.steps,
    )

    api.phase("checkpoint")
    # Only rank 0 writes, so only rank 0 needs (and makes) the folder.
    directory, temporary = (
        checkpoint_dir(os.environ.get(ENV_RUN_DIR)) if ctx.rank == 0 else (None, False)
    )
    try:
        path = save_checkpoint(
            ddp, directory, lambda: build_model(model_name, sync_batchnorm=False)
        )
        if path is not None:
            print(f"checkpoint: {path} (rank 0, reloaded strictly into a bare model)", flush=True)
    finally:
        if temporary and directory is not None:
            remove_checkpoint_dir(directory)

    api.phase("eval")
    result = evaluate(ddp.module, test_set, device=ctx.device, batch_size=cfg.batch_size * 4)
    api.log(eval_accuracy=round(result.accuracy, 4), eval_loss=round(result.loss, 4))
    if ctx.rank == 0:
        shares = ", ".join(f"rank {r}: {n}" for r, n in enumerate(result.per_rank_samples))
        print(
            f"eval: accuracy {result.accuracy:.1%}, loss {result.loss:.3f} on "
            f"{result.samples} samples ({shares})",
            flush=True,
        )
    return verify_parameters(ddp.module, ctx, api)


def verify_parameters(model: Any, ctx: DistContext, api: Any) -> int:
    api.phase("verify")
    check = check_parameters(model)
    if check.identical:
        api.log(params_identical=True, params_sha256=check.digests[0])
        if ctx.rank == 0:
            print(
                f"parameters identical on all {ctx.world_size} ranks "
                f"(sha256 {check.digests[0][:16]})",
                flush=True,
            )
        return int(ExitCode.OK)
    differing = list(check.differing_ranks())
    message = f"parameters differ across ranks: ranks {differing} do not match rank 0"
    api.log(params_identical=False)
    api.warn("reference.params_differ", message, digests=list(check.digests), ranks=differing)
    print(f"rank {ctx.rank}: {message}", file=sys.stderr, flush=True)
    return int(ExitCode.PROBLEMS)


def prepare_data(cfg: ReferenceConfig, ctx: DistContext) -> tuple[Any, Any, str]:
    """Local rank 0 prepares (or checks) the data while the other ranks wait; then all load it.

    The wait is an all_gather_object of each node's preparation status rather than a bare barrier,
    so a failure on the preparing rank stops every rank with its message instead of leaving the
    others blocked at the barrier until a timeout.
    """
    import torch.distributed as dist

    spec = SyntheticSpec(cfg.train_samples, cfg.test_samples, cfg.seed)
    status = "ok"
    if ctx.local_rank == 0:
        try:
            if cfg.data:
                load_cifar10(cfg.data)  # torchvision verifies the files here
            else:
                _, how = prepare_synthetic(cache_dir(), spec)
                status = f"ok: {how}"
        except Exception as exc:  # noqa: BLE001 - reported to every rank below
            status = f"error: {type(exc).__name__}: {exc}"
    statuses: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(statuses, status)
    failed = [(r, s) for r, s in enumerate(statuses) if str(s).startswith("error")]
    if failed:
        rank, message = failed[0]
        raise RuntimeError(f"data preparation failed on rank {rank}: {message[len('error: ') :]}")
    if cfg.data:
        train_set, test_set = load_cifar10(cfg.data)
        note = f"CIFAR-10 from {cfg.data}"
    else:
        train_set, test_set = load_synthetic(cache_dir() / spec.file_name)
        how = str(statuses[0]).removeprefix("ok: ")
        note = f"synthetic CIFAR-10 ({len(train_set)} train / {len(test_set)} test, {how})"
    return train_set, test_set, note


def train_loop(
    cfg: ReferenceConfig, ctx: DistContext, ddp: Any, train_set: Any, injector: Any, api: Any
) -> LoopResult:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    workers = cfg.workers_for(ctx.on_gpu)
    sampler: DistributedSampler = DistributedSampler(
        train_set, shuffle=True, seed=cfg.seed, drop_last=True
    )
    loader = DataLoader(
        train_set,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=ctx.on_gpu,
        drop_last=True,
        persistent_workers=workers > 0,
    )
    if len(loader) == 0:
        raise UsageError(
            f"--batch-size {cfg.batch_size} is larger than each rank's share of the data"
        )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=0.9)
    sync_steps = injector.sync_steps()
    step = epoch = 0
    window = _Window()
    loss_value = float("nan")
    start = steady_start = time.perf_counter()
    steady_cpu_start = time.process_time()
    while step < cfg.steps:
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        batches = iter(loader)
        while step < cfg.steps:
            t0 = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                break
            images = images.to(ctx.device, non_blocking=True)
            labels = labels.to(ctx.device, non_blocking=True)
            step += 1
            injector.before_step(step)
            logits = ddp(images)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradient buckets here
            optimizer.step()
            loss_value = float(loss.item())
            api.log(step=step, loss=loss_value)
            correct = int((logits.detach().argmax(dim=1) == labels).sum())
            window.add(loss_value, correct, int(labels.numel()), time.perf_counter() - t0)
            if step == WARMUP_STEPS:
                steady_start = time.perf_counter()
                steady_cpu_start = time.process_time()
            if step % cfg.log_every == 0 or step == cfg.steps or step in sync_steps:
                loss_mean, accuracy = _sync_window(window, step, injector, ctx.device)
                if ctx.rank == 0:
                    per_step = window.seconds / window.steps
                    rate = ctx.world_size * cfg.batch_size / per_step if per_step else 0.0
                    print(
                        f"step {step}/{cfg.steps}  epoch {epoch}  loss {loss_mean:.3f}  "
                        f"acc {accuracy:.0%}  {per_step * 1000:.1f} ms/step  {rate:.0f} samples/s",
                        flush=True,
                    )
                window = _Window()
        epoch += 1
    end, cpu_end = time.perf_counter(), time.process_time()
    return LoopResult(
        steps=step,
        epochs=epoch,
        seconds=end - start,
        steady_seconds=end - steady_start,
        steady_cpu_seconds=cpu_end - steady_cpu_start,
        last_loss=loss_value,
    )


@dataclass
class _Window:
    """This rank's training figures since the last log line."""

    loss_sum: float = 0.0
    steps: int = 0
    correct: int = 0
    samples: int = 0
    seconds: float = 0.0

    def add(self, loss: float, correct: int, samples: int, seconds: float) -> None:
        self.loss_sum += loss
        self.steps += 1
        self.correct += correct
        self.samples += samples
        self.seconds += seconds


def _sync_window(window: _Window, step: int, injector: Any, device: Any) -> tuple[float, float]:
    """Mean loss and accuracy over every rank's recent steps: a small all_reduce of four numbers,
    the collective a shape fault garbles on its rank (a fifth number: gloo aborts on the size)."""
    import torch
    import torch.distributed as dist

    size = injector.sync_size(step, 4)
    buffer = torch.zeros(size, dtype=torch.float64, device=device)
    buffer[:4] = torch.tensor(
        [window.loss_sum, window.steps, window.correct, window.samples], dtype=torch.float64
    )
    dist.all_reduce(buffer)
    loss_sum, steps, correct, samples = (float(v) for v in buffer[:4])
    return (loss_sum / steps if steps else float("nan"), correct / samples if samples else 0.0)
