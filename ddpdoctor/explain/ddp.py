"""DistributedDataParallel: the reducer's errors, the constructor's model check, DETAIL fingerprints."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.log_rules import Candidate, EvidenceList, Groups, rule
from ddpdoctor.findings import Finding, Severity

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def _unused_summary(groups: Groups) -> str:
    text = (
        "DDP's reducer found parameters that got no gradient: part of the model did not "
        "contribute to the loss"
    )
    if groups.get("lightning"):
        text += " (Lightning's DDP strategy, without unused-parameter detection)"
    if groups.get("indices"):
        text += f" (parameter indices {groups['indices'].strip()} on rank {groups.get('rank')})"
    return text


_UNUSED_FIXES = (
    "plain DDP: DistributedDataParallel(model, find_unused_parameters=True) (or "
    "static_graph=True when the same ones are always unused)",
    'Lightning: Trainer(strategy="ddp_find_unused_parameters_true") (or '
    "Trainer(strategy=DDPStrategy(static_graph=True)) when the same ones are always unused)",
    "accelerate: Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
    "find_unused_parameters=True)]) (or static_graph=True in the same kwargs)",
    "the HF Trainer: TrainingArguments(ddp_find_unused_parameters=True)",
)


def _unused_fix(groups: Groups) -> str:
    """The fix in the spelling of the framework that raised (Lightning's own message first)."""
    spellings = list(_UNUSED_FIXES)
    if groups.get("lightning"):
        spellings.insert(0, spellings.pop(1))
    return (
        "Use every parameter in the loss, or freeze (requires_grad_(False)) or remove the ones a "
        "step does not use; where some steps really skip parameters, let DDP look for them: "
        + "; ".join(spellings)
        + ". Under ddpdoctor run the parameters are named (ddp.unused_parameter_names); else "
        "TORCH_DISTRIBUTED_DEBUG=INFO names them."
    )


def _model_summary(groups: Groups) -> str:
    if groups.get("params_a"):
        return (
            f"The model differs across ranks: rank {groups['a']} has {groups['params_a']} "
            f"parameters, rank {groups['b']} has {groups['params_b']}"
        )
    return (
        f"The model differs across ranks: params[{groups.get('index')}] has shape "
        f"[{groups.get('sizes')}] here but not in process {groups.get('other')}"
    )


RULES = (
    rule(
        "ddp.unused_parameters",
        ERROR,
        r"Expected to have finished reduction in the prior iteration|"
        r"Parameter indices which did not receive grad for rank (?P<rank>\d+): (?P<indices>[\d ]+)|"
        r"(?P<lightning>your LightningModule has parameters that were not used in producing the "
        r"loss)",
        [
            "Expected to have finished reduction",
            "did not receive grad",
            "LightningModule has param",
        ],
        _unused_summary,
        _unused_fix,
        examples=(
            "Expected to have finished reduction in the prior iteration before starting a new one.",
            "RuntimeError: It looks like your LightningModule has parameters that were not used in "
            "producing the loss returned by training_step.",
        ),
    ),
    rule(
        "ddp.marked_ready_twice",
        ERROR,
        r"Expected to mark a variable ready only once|Parameter at index (?P<index>\d+)"
        r"(?: with name (?P<name>\S+))? has been marked as ready twice",
        ["mark a variable ready only once", "marked as ready twice"],
        lambda g: (
            "DDP saw a parameter's gradient twice in one iteration"
            + (f" ({g['name']})" if g.get("name") else "")
            + ": reentrant activation checkpointing or a parameter shared across passes"
        ),
        "Use torch.utils.checkpoint(..., use_reentrant=False) (Hugging Face: "
        "gradient_checkpointing_kwargs={'use_reentrant': False}; Lightning/accelerate: the same "
        "argument to the checkpoint call), or tell DDP the graph is static: plain DDP: "
        "DistributedDataParallel(model, static_graph=True); Lightning: "
        "DDPStrategy(static_graph=True); accelerate: "
        "DistributedDataParallelKwargs(static_graph=True). A parameter used twice in one forward "
        "(shared weights) needs static_graph=True too.",
        examples=(
            "Parameter at index 440 with name backbone.layers.3.mlp.fc2.bias has been marked as "
            "ready twice.",
        ),
    ),
    rule(
        "ddp.model_mismatch",
        ERROR,
        r"DDP expects same model across all ranks, but Rank (?P<a>\d+) has (?P<params_a>\d+) "
        r"params, while rank (?P<b>\d+) has inconsistent (?P<params_b>\d+) params|"
        r"params\[(?P<index>\d+)\] in this process with sizes \[(?P<sizes>[^\]]*)\] appears not "
        r"to match sizes of the same param in process (?P<other>\d+)",
        ["DDP expects same model", "appears not to match sizes"],
        _model_summary,
        "Build the model identically on every rank before wrapping it in DDP (no rank-dependent "
        "layers, adapters or loading on rank 0 only); load checkpoints on every rank.",
        rank_groups=("a", "b"),
        examples=(
            "RuntimeError: DDP expects same model across all ranks, but Rank 3 has 2247 params, "
            "while rank 0 has inconsistent 0 params.",
        ),
    ),
    rule(
        "ddp.grad_strides",
        WARNING,
        r"Grad strides do not match bucket view strides",
        ["Grad strides do not match bucket view strides"],
        "A gradient's memory layout (strides) differs from DDP's bucket view of it: DDP copies "
        "it on every step (slower), typically a parameter made non-contiguous or changed to "
        "channels_last after DDP was built",
        "Change the model's memory format (model.to(memory_format=torch.channels_last)) or "
        "make parameters contiguous BEFORE wrapping it in DDP, and keep them that way; "
        "gradient_as_bucket_view=True makes the gradients the bucket views themselves.",
        examples=(
            "[W reducer.cpp:1300] Warning: Grad strides do not match bucket view strides. This "
            "may indicate grad was not created according to the gradient layout contract, or "
            "that the param's strides changed since DDP was constructed.  This is not an error, "
            "but may impair performance.",
        ),
    ),
    rule(
        "ddp.syncbn_without_ddp",
        ERROR,
        r"SyncBatchNorm is only supported within torch\.nn\.parallel\.DistributedDataParallel",
        ["SyncBatchNorm is only supported"],
        "SyncBatchNorm ran outside DistributedDataParallel (or without a process group)",
        "Convert to SyncBatchNorm only when training under DDP; for single-process runs or "
        "evaluation use BatchNorm (or call the module after init_process_group inside DDP).",
        examples=(
            "AttributeError: SyncBatchNorm is only supported within "
            "torch.nn.parallel.DistributedDataParallel",
        ),
    ),
    rule(
        "ddp.syncbn_cpu",
        ERROR,
        r"SyncBatchNorm expected input tensor to be on GPU",
        ["SyncBatchNorm expected input"],
        "SyncBatchNorm only runs on GPU (or XPU) tensors, and this rank fed it CPU tensors",
        "Use BatchNorm for CPU/gloo training, or move the model and data to the rank's GPU.",
        examples=("ValueError: SyncBatchNorm expected input tensor to be on GPU or XPU",),
    ),
    rule(
        "ddp.find_unused_unneeded",
        INFO,
        r"find_unused_parameters=True was specified in DDP constructor, but did not find any "
        r"unused parameters",
        ["find_unused_parameters=True was specified"],
        "find_unused_parameters=True is set but every parameter got a gradient: an extra "
        "autograd traversal every iteration for nothing",
        "Drop find_unused_parameters=True (keep it only if some iterations really skip "
        "parameters); static_graph=True is another option.",
        examples=(
            "[rank0]:[W1122 04:12:29.113345382 reducer.cpp:1529] Warning: "
            "find_unused_parameters=True was specified in DDP constructor, but did not find any "
            "unused parameters in the forward pass.",
        ),
    ),
    rule(
        "ddp.collective_mismatch",
        ERROR,
        r"Detected mismatch between collectives on ranks",
        ["Detected mismatch between collectives"],
        emits=False,
        examples=(
            "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
            "collective: CollectiveFingerPrint(SequenceNumber=485, OpType=ALLREDUCE, "
            "TensorShape=[25], TensorDtypes=Float), but Rank 0 is running collective: "
            "CollectiveFingerPrint(SequenceNumber=485, OpType=BROADCAST, TensorShape=[1])",
        ),
    ),
)

_SIDES = re.compile(
    r"Rank (?P<a>\d+) is running collective: (?P<fa>.*?), but Rank (?P<b>\d+) is runnin(?P<fb>.*)"
)
_SEQ = re.compile(r"SequenceNumber=(\d+)")
_OP = re.compile(r"OpType=(\w+)")
_SHAPE = re.compile(r"TensorShape=\[([^\]]*)\]")
_DTYPE = re.compile(r"TensorDtypes=(\w+)")


@dataclass(frozen=True)
class _Fingerprint:
    op: str | None
    seq: str | None
    shape: str | None
    dtype: str | None

    @classmethod
    def parse(cls, text: str) -> _Fingerprint | None:
        fields = [pattern.search(text) for pattern in (_OP, _SEQ, _SHAPE, _DTYPE)]
        if fields[0] is None:
            return None
        return cls(*(m.group(1) if m else None for m in fields))

    def describe(self) -> str:
        text = f"{self.op} #{self.seq}" if self.seq is not None else str(self.op)
        if self.shape:
            text += f" of [{self.shape}]"
        if self.dtype:
            text += f" {self.dtype}"
        return text


class CollectiveMismatchAnalyzer:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL's 'Detected mismatch between collectives', every rank's view.

    A rank describes its own collective reliably; what it says about the other rank can be the
    verification collective DETAIL itself runs, so a rank's own report wins.
    """

    def __init__(self) -> None:
        self.own: dict[int, _Fingerprint] = {}
        self.seen_by_peer: dict[int, tuple[_Fingerprint | None, int]] = {}
        self.evidence = EvidenceList()

    def feed(self, line: SourceLine) -> None:
        if "Detected mismatch between collectives" not in line.text:
            return
        sides = _SIDES.search(line.text)
        if sides is None:
            self.evidence.add(line)
            return
        a, b = int(sides.group("a")), int(sides.group("b"))
        own = _Fingerprint.parse(sides.group("fa"))
        if own is not None:
            self.own.setdefault(a, own)
        self.seen_by_peer.setdefault(b, (_Fingerprint.parse(sides.group("fb")), a))
        self.evidence.add(line, (a, b))

    def end_file(self, file: str | None) -> None:
        return None

    def finish(self) -> list[Candidate]:
        if not self.evidence.lines:
            return []
        ranks = sorted(set(self.own) | set(self.seen_by_peer))
        sides = []
        for rank in ranks:
            if rank in self.own:
                sides.append(f"rank {rank}: {self.own[rank].describe()}")
                continue
            fingerprint, reporter = self.seen_by_peer[rank]
            sides.append(
                f"rank {rank}: {fingerprint.describe()} (as rank {reporter} reported it)"
                if fingerprint
                else f"rank {rank}: a different collective (its fingerprint is cut off)"
            )
        summary = "Ranks called different collectives at the same point"
        if sides:
            summary += " (" + "; ".join(sides) + ")"
        finding = Finding(
            id="ddp.collective_mismatch",
            severity=Severity.ERROR,
            summary=summary,
            fix="Every rank must call the same collectives in the same order with the same shapes "
            "and dtypes: look for collectives inside rank-dependent branches (if rank == 0: ...), "
            "rank-0-only evaluation or checkpointing through the DDP model, or data-dependent "
            "shapes.",
            ranks=tuple(sorted(self.evidence.ranks)),
            evidence=self.evidence.evidence(),
        )
        return [Candidate(finding)]
