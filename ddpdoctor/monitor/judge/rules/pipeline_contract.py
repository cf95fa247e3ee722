"""The pipeline's contract differs across ranks (ddpdoctor/runtime/pipeline_hooks.py): a
mismatch before the first step that would show it.

At a schedule's first step() each rank publishes its schedule class, number of microbatches,
number of stages and stages per rank; the last rank to arrive compares them and writes a warning
`pipeline.contract_mismatch` whose message ends like the SPMD contract's (`[culprits 0; line
FILE:LINE; t UNIX]`). Stages that disagree on the microbatches send tensors of one size to
neighbours that expect another (PipeliningShapeError on whichever stage notices first, or a
send nobody receives), so the verdict is a mismatch of the ranks that differ, at the line that
built their schedule, whichever stage trips first.
"""

from __future__ import annotations

from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.judge.rules.contract import from_warning
from ddpdoctor.monitor.model.snapshot import Snapshot

CODE = "pipeline.contract_mismatch"
FIX = (
    "Build the same pipeline on every rank: the same schedule class, the same n_microbatches "
    "and the same number of stages (PipelineStage's num_stages), from values that do not "
    "depend on the rank. Each stage splits its batch into n_microbatches chunks and sends one "
    "chunk per microbatch: a stage with another count sends tensors of another size, or more "
    "or fewer of them, than its neighbour receives."
)


def detect(snap: Snapshot) -> RuleOutcome | None:
    return from_warning(snap, CODE, FIX, "pipeline_contract", "compared the pipeline's contracts")
