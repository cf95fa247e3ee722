"""Run the rules on a snapshot, pick the verdict, and fold the diagnosis into the snapshot.

Which problem came first decides the verdict: a collective mismatch explains the crash it causes
on gloo; a hang that was established before any rank failed stays a hang (the failures that
follow are the job being stopped); otherwise the first failure is a crash. Everything else
(uneven inputs, sampler misuse, stragglers, runtime warnings, the log explainers' findings) is
reported alongside. The flight recorder's evidence and the script checkup's citations are added
to the findings they support, last (ddpdoctor.monitor.judge.fr_evidence, .script_citations).

Once the launcher has stopped the job for a verdict, that verdict is `held`: it stays the verdict,
with the culprits it was stopped for, and whatever the ranks do after the stop (a framework's
SIGTERM handler running one more collective, a peer's "Connection closed by peer", teardown) is
listed as a consequence of the stop, never diagnosed anew.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ddpdoctor.findings import Finding, sort_findings
from ddpdoctor.monitor.judge.fr_evidence import annotate as with_flight_recorder
from ddpdoctor.monitor.judge.job_text import weigh_exit_reports
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.judge.rules import chance_pairing as chance_pairing_rule
from ddpdoctor.monitor.judge.rules import contract as contract_rule
from ddpdoctor.monitor.judge.rules import crash as crash_rule
from ddpdoctor.monitor.judge.rules import fr_hang as fr_hang_rule
from ddpdoctor.monitor.judge.rules import fr_mismatch as fr_mismatch_rule
from ddpdoctor.monitor.judge.rules import grad_syncs as grad_syncs_rule
from ddpdoctor.monitor.judge.rules import hang as hang_rule
from ddpdoctor.monitor.judge.rules import mismatch as mismatch_rule
from ddpdoctor.monitor.judge.rules import network as network_rule
from ddpdoctor.monitor.judge.rules import p2p as p2p_rule
from ddpdoctor.monitor.judge.rules import pipeline_contract as pipeline_contract_rule
from ddpdoctor.monitor.judge.rules import recovery as recovery_rule
from ddpdoctor.monitor.judge.rules import rendezvous as rendezvous_rule
from ddpdoctor.monitor.judge.rules import replicas as replicas_rule
from ddpdoctor.monitor.judge.rules import runtime_warnings as warnings_rule
from ddpdoctor.monitor.judge.rules import sampler as sampler_rule
from ddpdoctor.monitor.judge.rules import straggler as straggler_rule
from ddpdoctor.monitor.judge.rules import torchft as torchft_rule
from ddpdoctor.monitor.judge.rules import torchft_stall as torchft_stall_rule
from ddpdoctor.monitor.judge.rules import transport as transport_rule
from ddpdoctor.monitor.judge.rules import uneven as uneven_rule
from ddpdoctor.monitor.judge.rules import wait as wait_rule
from ddpdoctor.monitor.judge.rules import world_size as world_size_rule
from ddpdoctor.monitor.judge.script_citations import annotate as with_script_checkup
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import RankState, RankView, Snapshot, Verdict, WaitView

# A mismatch explains a crash that follows it; allow for the abort to land a little later.
MISMATCH_EXPLAINS_CRASH_S = 1.0
# Set: every diagnosis is checked against the rules' walk over every rank (diagnose).
CHECK_INDEX = "DDPDOCTOR_CHECK_INDEX"


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    findings: tuple[Finding, ...] = ()
    culprits: frozenset[int] = field(default_factory=frozenset)
    started_t: float | None = None
    onset_t: float | None = None
    stalled: frozenset[int] = field(default_factory=frozenset)
    waiting_on: tuple[tuple[int, tuple[int, ...]], ...] = ()
    waits: tuple[WaitView, ...] = ()
    confirmed: bool = False  # certain enough to stop the job on (RuleOutcome.confirmed)
    # The rule outcome that set the verdict: what the launcher holds once it stops the job on it.
    primary: RuleOutcome | None = field(default=None, compare=False)

    @property
    def detected_after_s(self) -> float | None:
        """Problem start to the moment the verdict's condition held (post-mortem timing)."""
        if self.started_t is None or self.onset_t is None:
            return None
        return max(0.0, self.onset_t - self.started_t)


def _primary(snap: Snapshot) -> tuple[RuleOutcome | None, RuleOutcome | None]:
    """(the outcome that sets the verdict, the crash outcome if any)."""
    crash = crash_rule.detect(snap)
    p2p = p2p_rule.detect(snap)  # who waits for whom through send/recv: a hang or a deadlock
    p2p_deadlock = p2p if p2p is not None and p2p.verdict is Verdict.MISMATCH else None
    mismatch = (
        contract_rule.detect(snap)
        or pipeline_contract_rule.detect(snap)
        or p2p_deadlock
        or mismatch_rule.detect(snap)
        or grad_syncs_rule.detect(snap)
        or world_size_rule.detect(snap)
        or fr_mismatch_rule.detect(snap)
    )
    if mismatch is not None and (
        crash is None
        or (mismatch.onset_t or 0.0) <= (crash.onset_t or 0.0) + MISMATCH_EXPLAINS_CRASH_S
    ):
        return mismatch, crash
    # the events' hang first: with the flight recorder's at the same onset, the events' wins
    hang, fr_hang = hang_rule.detect(snap), fr_hang_rule.detect(snap)
    hang = hang or torchft_stall_rule.detect(snap)  # torchft does not wait for a stalled replica
    # no culprit: which link stopped carrying bytes, where the nodes' looks tell
    network = network_rule.detect(snap) if hang is None and fr_hang is None else None
    p2p_hang = p2p if p2p is not None and p2p.verdict is Verdict.HANG else None
    outcomes = (p2p_hang, hang, fr_hang, network or transport_rule.detect(snap))
    stuck = [o for o in outcomes if o is not None]
    if stuck:
        first = min(stuck, key=lambda o: o.onset_t or 0.0)
        if crash is None or (first.onset_t or 0.0) <= (crash.onset_t or 0.0):
            return first, crash
    if crash is None:
        # replicas that stopped agreeing: a mismatch of a job that neither hangs nor crashes
        return replicas_rule.detect(snap), None
    return crash, crash


_STOP_SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT")


def reports_the_stop(finding: Finding) -> bool:
    """A launcher's report that a rank was ended by a signal: torchrun's failure table, or an
    mp.spawn parent's `ProcessExitedException: process 0 terminated with signal SIGTERM`, or
    torchrun's own traceback of the SIGTERM that stopped it."""
    if finding.id == "torchrun.signal":
        return any(name in finding.summary for name in _STOP_SIGNALS)
    if finding.id == "torchrun.stopped":  # "torchrun was stopped from outside by SIGTERM"
        return True
    return (
        finding.id == "python.exception"
        and "ProcessExitedException" in finding.summary
        and any(f"terminated with signal {name}" in finding.summary for name in _STOP_SIGNALS)
    )


def _after_stop(snap: Snapshot, held: RuleOutcome) -> tuple[RuleOutcome, RuleOutcome | None]:
    """(the held outcome, the crash outcome of the ranks that failed other than its culprits)."""
    if held.verdict is not Verdict.CRASH:
        failures = crash_rule.failures(snap)
        stopped_t = held.stopped_t
        if (
            failures
            and stopped_t is not None
            and all(v.failed_t is not None and v.failed_t >= stopped_t for v in failures)
        ):
            # every rank that failed did so once ddpdoctor had stopped the job: the stop's effect
            # (a rank killed in its collective "vanished"), never a death of its own
            after = f"the {held.verdict.value if held.verdict else 'problem'} (ddpdoctor stopped the job)"
            stop = crash_rule.consequences(failures, None, after=after)
            return held, RuleOutcome(rule="stop", findings=(stop,))
        return held, crash_rule.detect(snap)
    # A rank the held crash already counts as its consequence failed because of it, not of
    # the stop: said once, the way the crash said it, with what the rank says now (an error
    # read after the stop replaces "vanished").
    failures = crash_rule.failures(snap)
    told = {r for f in held.findings if f.id == "crash.consequence" for r in f.ranks}
    held = _told_as_it_stands(held, failures)
    others = [v for v in failures if v.rank not in held.culprits and v.rank not in told]
    if not others:
        return held, None
    after = "the crash (ddpdoctor stopped the job)"
    stop = crash_rule.consequences(others, None, after=after)
    return held, RuleOutcome(rule="stop", findings=(stop,))


def _told_as_it_stands(held: RuleOutcome, failures: list[RankView]) -> RuleOutcome:
    """The held crash with the evidence of its consequence finding made again from its ranks'
    views now; as it was when one of them no longer shows as failed."""
    found = [f for f in held.findings if f.id == "crash.consequence"]
    if len(found) != 1:
        return held
    told = [v for v in failures if v.rank in found[0].ranks]
    if {v.rank for v in told} != set(found[0].ranks):
        return held
    causes = sorted((v for v in failures if v.rank in held.culprits), key=_failed_first)
    fresh = crash_rule.consequences(told, causes[0] if causes else None)
    updated = replace(found[0], evidence=fresh.evidence)
    return replace(held, findings=tuple(updated if f is found[0] else f for f in held.findings))


def _failed_first(view: RankView) -> float:
    return view.failed_t if view.failed_t is not None else float("inf")


def diagnose(
    snap: Snapshot, *, extra_findings: Sequence[Finding] = (), held: RuleOutcome | None = None
) -> Diagnosis:
    """`held`: the outcome the launcher stopped the job for (see the module's note).

    With DDPDOCTOR_CHECK_INDEX set (the tests set it), each diagnosis is made a second time
    with every rule walking every rank (model.rank_index) and must be the same, or this raises."""
    diagnosis = _diagnose(snap, extra_findings=extra_findings, held=held)
    if os.environ.get(CHECK_INDEX):
        with rank_index.walking_every_rank():
            reference = _diagnose(snap, extra_findings=extra_findings, held=held)
        if diagnosis != reference or diagnosis.primary != reference.primary:
            raise AssertionError(
                f"{CHECK_INDEX}: the rank index changed the diagnosis: {_told(diagnosis)} "
                f"instead of {_told(reference)}"
            )
    return diagnosis


def _told(diagnosis: Diagnosis) -> str:
    primary = diagnosis.primary
    return repr(
        (diagnosis, primary.rule if primary else None, [f.to_json() for f in diagnosis.findings])
    )


def _diagnose(
    snap: Snapshot, *, extra_findings: Sequence[Finding], held: RuleOutcome | None
) -> Diagnosis:
    # torchft's replicas that failed while the run may still recover: out of the rules' sight
    excused = torchft_rule.recovering(snap) if held is None else frozenset()
    recovery = torchft_rule.detect(snap, excused)
    observed, snap = snap, torchft_rule.without(snap, excused)
    primary, crash = _primary(snap) if held is None else _after_stop(snap, held)
    attempts_told: list[Finding] = []
    if held is None:  # a failure the launcher recovers from is no verdict (rules.recovery)
        primary, crash, attempts_told = recovery_rule.weigh(snap, primary, crash)
    else:
        attempts_told = recovery_rule.told(snap, problem=held.verdict is not None)
    verdict = primary.verdict if primary is not None and primary.verdict else snap.verdict
    findings: list[Finding] = list(primary.findings) if primary is not None else []
    if primary is not None and crash is not None and primary is not crash:
        root = crash_rule.root_cause(snap)
        if crash.rule == "stop":
            findings.extend(crash.findings)
        elif (
            primary.verdict is Verdict.MISMATCH
            and root
            and not crash_rule.looks_like_consequence(root)
        ):
            findings.extend(crash.findings)  # the crash the mismatch caused, as evidence
        else:
            what = "mismatch" if primary.verdict is Verdict.MISMATCH else "hang"
            stopper = "ddpdoctor stopped the job" if held is not None else "the job was stopped"
            findings.append(
                crash_rule.consequences(
                    crash_rule.failures(snap), None, after=f"the {what} ({stopper})"
                )
            )
    findings.extend(attempts_told)
    secondary: list[Finding] = []
    waits = wait_rule.detect(snap)
    if waits is not None and not verdict.is_problem:
        # a wait for a busy rank says "not a hang"; beside a problem verdict it would confuse
        secondary.extend(waits.findings)
    for outcome in (
        recovery,
        rendezvous_rule.detect(snap),
        # torchft's replica groups train different numbers of steps by design (a group that
        # heals skips to its peer's step): uneven steps say nothing there
        None
        if snap.torchft is not None
        else uneven_rule.detect(
            snap, verdict, died=primary.culprits if verdict is Verdict.CRASH and primary else None
        ),
        sampler_rule.detect(snap),
        straggler_rule.detect(snap),
        warnings_rule.detect(snap),
        chance_pairing_rule.detect(snap) if not verdict.is_problem else None,
        replicas_rule.notes(snap),
        network_rule.names(snap) if primary is None or primary.rule != "network" else None,
    ):
        if outcome is not None:
            secondary.extend(outcome.findings)
    if held is not None or any(f.id == "crash.consequence" for f in findings):
        # The stop was ddpdoctor's (or the watchdog's after the hang): torchrun's report that a
        # rank was terminated "from outside" says nothing the consequence finding does not.
        extra_findings = [f for f in extra_findings if not reports_the_stop(f)]
    # Text reports of a rank's end that ddpdoctor's observation contradicts: information only.
    weighed = torchft_rule.weigh(list(extra_findings), observed, excused)
    secondary.extend(recovery_rule.settle(weigh_exit_reports(weighed, snap), snap, verdict))
    seen = {(f.id, f.summary) for f in findings}
    for finding in sort_findings(secondary):
        if (finding.id, finding.summary) not in seen:
            seen.add((finding.id, finding.summary))
            findings.append(finding)
    wait_views = waits.waits if waits is not None else ()
    findings = list(with_flight_recorder(findings, snap))
    findings = list(with_script_checkup(findings, snap))  # the preflight's line, where it explains
    if primary is None or primary.verdict is None:
        return Diagnosis(verdict=verdict, findings=tuple(findings), waits=wait_views)
    return Diagnosis(
        verdict=verdict,
        findings=tuple(findings),
        culprits=primary.culprits,
        started_t=primary.started_t,
        onset_t=primary.onset_t,
        stalled=primary.stalled,
        waiting_on=primary.waiting_on,
        waits=wait_views,
        confirmed=primary.confirmed,
        primary=primary,
    )


def apply_diagnosis(
    snap: Snapshot, diagnosis: Diagnosis, *, detected_after_s: float | None = None
) -> Snapshot:
    """The snapshot with the verdict, findings and culprits set and the culprits shown stalled."""
    ranks = list(snap.ranks)
    if diagnosis.stalled or diagnosis.waiting_on:
        waiting = dict(diagnosis.waiting_on)
        for i, view in enumerate(ranks):
            if view.rank in diagnosis.stalled and not view.state.finished:
                ranks[i] = replace(view, state=RankState.STALLED)
            elif view.rank in waiting and not view.state.finished:
                ranks[i] = replace(view, state=RankState.WAITING, waiting_on=waiting[view.rank])
    return replace(
        snap,
        ranks=tuple(ranks),
        verdict=diagnosis.verdict,
        findings=diagnosis.findings,
        culprits=diagnosis.culprits,
        detected_after_s=detected_after_s
        if detected_after_s is not None
        else diagnosis.detected_after_s,
        problem_started_t=diagnosis.started_t,
        waits=diagnosis.waits,
        confirmed=diagnosis.confirmed,
    )


# Findings that stay once found: they tell of a moment (a chance pairing) that the ranks' latest
# calls no longer show a poll later. At most MAX_KEPT are kept.
KEPT_ONCE_FOUND = frozenset({chance_pairing_rule.CODE})
MAX_KEPT = 8


def _said_key(finding: Finding) -> tuple[str, str]:
    # the call that paired (its first evidence: rank, op, number, line), not the summary, whose
    # "at step N" is the rank's step at the poll: later polls of one pairing say later steps
    return finding.id, finding.evidence[0].text if finding.evidence else finding.summary


def keep_said(diagnosis: Diagnosis, said: dict[tuple[str, str], Finding]) -> Diagnosis:
    """`diagnosis` with the findings of KEPT_ONCE_FOUND that earlier polls found (`said`, the
    caller's memory, updated here), each as it was first said (the step it happened at)."""
    for finding in diagnosis.findings:
        if finding.id in KEPT_ONCE_FOUND and len(said) < MAX_KEPT:
            said.setdefault(_said_key(finding), finding)
    if not said:
        return diagnosis
    findings = tuple(
        said.get(_said_key(f), f) if f.id in KEPT_ONCE_FOUND else f for f in diagnosis.findings
    )
    present = {_said_key(f) for f in findings if f.id in KEPT_ONCE_FOUND}
    missing = tuple(f for key, f in said.items() if key not in present)
    return replace(diagnosis, findings=findings + missing)
