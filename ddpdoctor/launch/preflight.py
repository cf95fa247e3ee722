"""The preflight of `ddpdoctor run`: the doctor for this launch, and what a refusal leaves behind.

Only facts about this machine and this launch refuse a launch (ddpdoctor.checks.gate): a held
port, a variable that contradicts the launch, no GPU for `--backend nccl`, an unreachable
master. The script checkup's findings are printed before the launch with their line and fix and
kept in doctor.json, where the diagnosis cites them when their symptom appears; they never
refuse. A refused launch leaves diagnosis.json with the refusing checks as its findings, on one
node or on each node of a job over several.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console

from ddpdoctor.console import one_line, symbols_for
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.launch.plan import LaunchPlan
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.node_records import NodeRecorder
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic


def preflight(plan: LaunchPlan, run_dir: RunDir, console: Console) -> dict[str, Any] | None:
    """Run the doctor for this job and keep its report (doctor.json); the report's JSON when a
    fact about this machine or launch refuses the launch (after printing why), else None.

    The script checkup's findings never refuse (ddpdoctor.checks.gate): they are printed with
    their line and fix, kept in doctor.json, and cited by the diagnosis if their symptom shows."""
    from ddpdoctor.checks.context import DoctorOptions
    from ddpdoctor.checks.gate import refusing, static_problems
    from ddpdoctor.checks.progress import progress_spinner
    from ddpdoctor.checks.render import render_report
    from ddpdoctor.checks.runner import run_checks

    meeting_addr, meeting_port = plan.rendezvous.meeting_point()
    from_endpoint = plan.rendezvous.master_addr is None and meeting_addr is not None
    options = DoctorOptions(
        nproc=plan.nproc_per_node,
        nnodes=plan.max_nodes,
        backend=plan.backend,
        master_addr=meeting_addr,
        master_port=meeting_port,
        address_flag="--rdzv-endpoint" if from_endpoint else None,
        workers=plan.workers,
        scripts=plan.checkup_scripts,
        # torchrun --standalone picks a free port: a busy 29500 is nothing to this launch.
        launcher_picks_port=plan.rendezvous.standalone,
    )
    with progress_spinner(not plan.json) as on_progress:
        report = run_checks(options=options, on_progress=on_progress)
    document = report.to_json()
    write_json_atomic(run_dir.doctor_json_for(plan.node_rank), document)
    render_report(report, console, symbols=symbols_for(console.file))
    blockers = refusing(report.results)
    if blockers:
        failed = any(r.status.value == "fail" for r in blockers)
        what = "failed a check" if failed else "could not run a check"
        console.print(
            f"ddpdoctor run: the doctor {what} about this machine or launch, so the job was not "
            "started: apply the fixes above, or rerun with --no-doctor to launch anyway",
            markup=False,
        )
        return document
    if static_problems(report.results):
        console.print(
            "ddpdoctor run: the script checkup's findings above are a reading of the source, "
            "which cannot know which branch runs: the job starts, and the diagnosis cites them "
            "if their symptom appears",
            markup=False,
        )
    console.print()
    return None


def refuse(
    plan: LaunchPlan,
    watchers: Any,  # launcher.Watchers (its .monitor makes the Monitor that writes diagnosis.json)
    run_dir: RunDir,
    console: Console,
    recorder: NodeRecorder | None,
    report: dict[str, Any],
) -> int:
    """The preflight refused the launch: say so where every tool looks. diagnosis.json (so that
    `watch` ends at once) holds the refusing checks as its findings, on one node or many (a node
    of a job over several writes it unless the lead already wrote its final one); the node
    record says this node ended; exit 1."""
    code = int(ExitCode.PROBLEMS)
    if recorder is not None:
        recorder.ended(code, None, time.time())
    monitor = watchers.monitor(run_dir, hang_after=plan.hang_after, node_rank=plan.node_rank)
    final = monitor.close(job_ended=True)
    console.print(f"run directory: {one_line(str(run_dir.path))}", markup=False)
    console.print(f"verdict: not started (exit code {code})", markup=False)
    if plan.json:  # diagnosis.json (the refusing checks as findings), the report, the job
        doc = final.diagnosis_json()
        doc["doctor"] = report
        doc["job"] = {"exit_code": code, "started": False}
        sys.stdout.write(jsontext.dumps(doc, indent=2) + "\n")
    return code
