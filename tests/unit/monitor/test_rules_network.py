"""The network rule on the looks two lab hosts wrote at real cuts (tests/fixtures/network/,
recorded from `ddpdoctor run --nnodes 2` on h1 and h2 of `make lab`), and on made-up ones."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.judge.rules import network
from ddpdoctor.monitor.model.network import NameView, node_network_from_json
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_builders import NOW, snap, view, waiting

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "network"


def looks(case: str, now: float = NOW):
    out = []
    for node in (0, 1):
        report = node_network_from_json(
            json.loads((FIXTURES / case / f"node-{node}.json").read_text())
        )
        assert report is not None
        out.append(replace(report, t=now))
    return tuple(out)


def stalled(rank: int, host: str, for_s: float = 10.0):
    return view(rank, RankState.STALLED, host=host, last_progress_t=NOW - for_s)


def test_both_ways_cut_names_the_pair_the_connection_and_the_probe():
    out = network.detect(snap([stalled(0, "h1"), stalled(1, "h2")], network=looks("cut-both")))
    assert out is not None and out.verdict is Verdict.HANG and out.confirmed and not out.culprits
    # before twice the threshold the job is not stopped yet: a link may come back
    early = network.detect(
        snap([stalled(0, "h1", 7.0), stalled(1, "h2", 7.0)], network=looks("cut-both"))
    )
    assert early is not None and early.verdict is Verdict.HANG and not early.confirmed
    summary = out.findings[0].summary
    assert "the link between h1 and h2 carries nothing in either direction" in summary
    assert "queued on rank 0's connection to 198.19.77.12" in summary
    assert "a probe from h1 to h2 times out" in summary


def test_one_way_cut_names_the_direction_from_both_ends_segment_counts():
    """h1 drops what h2 sends; h1, waiting for h2's data, has nothing of its own to send, so no
    count shows h1 → h2 delivering during the stall: the pair is named, no direction. Once h1
    has segments in flight that all arrive, h1 → h2 is seen to carry."""
    out = network.detect(snap([stalled(0, "h1"), stalled(1, "h2")], network=looks("cut-one-way")))
    assert out is not None
    summary = out.findings[0].summary
    assert "the link between h1 and h2 carries nothing in either direction" in summary, summary
    texts = [e.text for e in out.findings[0].evidence]
    assert any("segments h2 sent on the job's connections never reached h1" in t for t in texts)
    h1, h2 = looks("cut-one-way")
    busy = tuple(replace(link, send_q=4096) for link in h1.links)
    out = network.detect(
        snap([stalled(0, "h1"), stalled(1, "h2")], network=(replace(h1, links=busy), h2))
    )
    assert out is not None
    assert "the link h2 → h1 carries nothing (h1 → h2 does)" in out.findings[0].summary


def test_a_rank_still_progressing_is_no_network_hang():
    ranks = [stalled(0, "h1"), view(1, host="h2")]
    assert network.detect(snap(ranks, network=looks("cut-both"))) is None


def test_a_short_stall_is_not_judged():
    ranks = [stalled(0, "h1", 2.0), stalled(1, "h2", 2.0)]
    assert network.detect(snap(ranks, network=looks("cut-both"))) is None


def test_links_that_carry_make_no_finding():
    quiet = []
    for report in looks("cut-both"):
        links = tuple(
            replace(
                link,
                send_q=0,
                retransmits=0,
                total_retrans=0,
                last_ack_ms=100,
                segs_in=5,
                segs_out=5,
            )
            for link in report.links
        )
        probes = tuple(replace(p, answered=True, outcome="connected") for p in report.probes)
        quiet.append(replace(report, links=links, probes=probes))
    ranks = [stalled(0, "h1"), stalled(1, "h2")]
    assert network.detect(snap(ranks, network=tuple(quiet))) is None


def test_a_hang_with_a_culprit_stays_the_hang_rules():
    # rank 1 is behind (it never reached #41): the hang rule names it, the network rule waits
    ranks = [
        waiting(0, 41, 9.0, host="h1"),
        view(1, RankState.STALLED, host="h2", seq=40, last_progress_t=NOW - 9),
    ]
    diagnosis = diagnose(snap(ranks, network=looks("cut-both")))
    assert diagnosis.culprits == frozenset({1})
    assert all(f.id != "network.link" for f in diagnosis.findings)


def test_a_changed_name_while_running_is_a_warning_with_both_answers():
    report = looks("cut-both")[1]
    name = NameView("h1", "rendezvous endpoint", ("198.18.0.11",), ("198.18.0.99",), None, 0.0)
    moved = replace(report, links=(), probes=(), names=(name,))
    diagnosis = diagnose(snap([view(0, host="h1"), view(1, host="h2")], network=(moved,)))
    assert diagnosis.verdict is Verdict.RUNNING
    found = [f for f in diagnosis.findings if f.id == "network.name_changed"]
    assert found and found[0].summary == (
        "on h2, rendezvous endpoint h1 resolved to 198.18.0.11 when the job started; now to 198.18.0.99"
    )


def test_a_name_that_stopped_resolving_says_so():
    name = NameView("h1", "MASTER_ADDR", ("198.18.0.11",), (), "Name or service not known", 0.0)
    assert network.describe_name("h2", name).endswith("now to nothing (Name or service not known)")


def test_crafted_reports_are_dropped_not_raised():
    assert node_network_from_json({"schema_version": 1, "t": "x"}) is None
    assert node_network_from_json([1, 2]) is None
    data = json.loads((FIXTURES / "cut-both" / "node-0.json").read_text())
    data["links"] = [{"rank": "zero"}, *data["links"]]
    report = node_network_from_json(data)
    assert report is not None and len(report.links) == len(data["links"]) - 1


def test_an_interface_set_down_is_named_and_its_peer_has_no_carrier():
    out = network.detect(
        snap([stalled(0, "h1"), stalled(1, "h2")], network=looks("interface-down"))
    )
    assert out is not None and out.confirmed
    summary = out.findings[0].summary
    assert "h2's ddn0 (198.19.77.12) is down" in summary
    assert "h1's ddn0 (198.19.77.11) has no carrier" in summary


def test_with_one_node_look_the_peer_is_named_by_the_names_it_resolved():
    only_h2 = looks("interface-down")[1:]
    out = network.detect(snap([stalled(0, "h1"), stalled(1, "h2")], network=only_h2))
    assert out is not None
    assert "the link between h1 and h2" in out.findings[0].summary


def test_a_peer_named_by_this_hosts_resolver_before_its_own_look_comes():
    h1 = looks("cut-both")[0]
    peer = NameView("h2", "a host of the job", None, ("198.19.77.12",), None, 0.0)
    alone = (replace(h1, names=(*h1.names, peer)),)
    out = network.detect(snap([stalled(0, "h1"), stalled(1, "h2")], network=alone))
    assert out is not None
    assert "the link between h1 and h2 carries nothing" in out.findings[0].summary
    assert "a probe from h1 to h2 times out" in out.findings[0].summary
    assert network.name_changes(alone) == []  # a peer's name is no name of the job's to watch


def test_an_interface_down_claims_no_direction_from_the_counters():
    reports = list(looks("interface-down"))
    # as at the stop: h2's segments counted out, none of them in at h1
    h2 = reports[1]
    links = tuple(replace(link, segs_out=(link.segs_out or 0) + 900) for link in h2.links)
    reports[1] = replace(h2, links=links)
    out = network.detect(snap([stalled(0, "h1"), stalled(1, "h2")], network=tuple(reports)))
    assert out is not None
    summary = out.findings[0].summary
    assert "→" not in summary and "the link between h1 and h2 carries nothing" in summary


def test_a_look_the_watcher_does_not_vouch_for_explains_and_never_confirms_a_stop():
    """node-1.json is a file: one claiming a dead peer while the watcher's own look sees its
    probe answered keeps the finding (to explain) but not the stop."""
    own, other = looks("cut-both")
    answered = replace(own, probes=tuple(replace(p, answered=True) for p in own.probes))
    ranks = [stalled(0, "h1"), stalled(1, "h2")]
    claimed = network.detect(snap(ranks, network=(answered, replace(other, vouched=False))))
    assert claimed is not None and claimed.verdict is Verdict.HANG and not claimed.confirmed
    assert "a probe from h2 to h1" in claimed.findings[0].summary
    # the same look vouched for (its node's launcher counts a rank the watcher vouched for)
    assert network.detect(snap(ranks, network=(answered, other))).confirmed
    # the watcher's own look showing the cut confirms it whatever the other file says
    own_cut = network.detect(snap(ranks, network=(own, replace(other, vouched=False))))
    assert own_cut is not None and own_cut.confirmed


def test_whether_a_look_is_vouched_for_is_never_written_or_read():
    report = looks("cut-both")[1]
    data = replace(report, vouched=False).to_json()
    assert "vouched" not in data
    data["vouched"] = False
    parsed = node_network_from_json(data)
    assert parsed is not None and parsed.vouched  # after the fact: evidence, nothing to stop


def test_a_live_watcher_vouches_for_its_own_look_only():
    from types import SimpleNamespace

    from ddpdoctor.monitor.pipeline.seen import look_vouched

    record = SimpleNamespace(host="h2")
    own, other = looks("cut-both")
    monitor = SimpleNamespace(
        node_rank=0,
        nodes={1: record},
        merge=SimpleNamespace(feed=SimpleNamespace(seen={1: SimpleNamespace(ranks=[1])})),
        vouching=SimpleNamespace(vouched={1: 4242}),
        network=SimpleNamespace(own=lambda look: look is own),  # the look it took itself
    )
    assert look_vouched(monitor, own)
    # this node's look as a file says (any process of the job can write it): not its own
    assert not look_vouched(monitor, replace(own, stalled_s=99.0))
    # another node's look, however plausible (its record's host, a rank of it vouched for):
    # a file any process of the job can write; it explains, it stops nothing
    assert not look_vouched(monitor, other)
    assert not look_vouched(monitor, replace(other, node_rank=5))


@pytest.mark.parametrize("earlier_retransmits", [0, 3])
def test_a_direction_that_sent_nothing_is_not_said_to_carry(earlier_retransmits):
    """Both ways cut while only h2 had bytes to send (rank 0 waits to receive): h1's side lost
    nothing because it sent nothing, which does not make h1 → h2 a working direction; nor do
    its connection's retransmits from earlier in the job (a count of its life: 3 at a real cut
    both ways in the lab under load, once read as "sending" and named "h1 → h2 carries nothing
    (h2 → h1 does)")."""
    h1, h2 = looks("cut-one-way")
    idle = tuple(
        replace(link, total_retrans=earlier_retransmits, retransmits=0, send_q=0)
        for link in h1.links
    )
    out = network.detect(
        snap([stalled(0, "h1"), stalled(1, "h2")], network=(replace(h1, links=idle), h2))
    )
    assert out is not None
    summary = out.findings[0].summary
    assert "the link between h1 and h2 carries nothing in either direction" in summary, summary
