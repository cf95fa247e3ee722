"""A healthy gloo job whose rank 0 writes, while both ranks train, claims into its own run
directory that ddpdoctor must check against what it sees before they may stop anything.

    ddpdoctor run ... -- forge_claims.py --forge exit,pid [--seconds S] [--stall S]

--forge (comma-separated):
  exit     an error and `exit 1` appended to rank 1's event file, while rank 1 goes on
  pid      events/rank-7.jsonl: a hello naming rank 0's own live pid and a world of 8, an error,
           `exit 1`
  gone     the other node's summary, rewritten with `"gone": [<rank 1>]` (its real host, pid
           and contents), several times
  network  during a stall of every rank (--stall S), nodes/node-<this node>/network.json: this
           node's number and host, lo "down" and a silent link from this host to itself
  runjson  run.json rewritten with `world_size` 20000000
  collective  rank 1's next collective, forged: a `collective_start` of a broadcast of another
           shape with the number rank 1's own next all_reduce will have, appended to its events
  error    a fatal error appended to rank 1's events, without an exit, while rank 1 goes on
  steps    rank 1's steps, forged far ahead (step 100000 onwards, then its own steps go on)
  stallcall  at the stall (--stall S), rank 1 computes for S seconds while rank 0 waits for it
           in the next all_reduce, and rank 1's next call is forged as a broadcast
  beats    with stallcall: while rank 1 computes, a stream of heartbeats forged into its events
           every 0.05 s (numbered far ahead, the same CPU seconds and frame: "blocked")
  rows     (two nodes) node 1's summary, rewritten once, just after its launcher wrote it: its
           rank's row names one call more, a broadcast of [7, 3] numbered as its own next
           all_reduce will be (its launcher's host and pid, the write number after the one read)
  rowsloop the same for 8 s: each write of the launcher forged at once, and the forged file
           written again every 0.3 s, numbered on (the forged call kept at its number)
  peernet  (two nodes) the other node's network.json: its number and host, a link from it to
           this node that carries nothing and a probe of this node that timed out, rewritten
           during a stall of every rank

Both ranks then all-reduce four times a second for about S seconds (the same number of times
on each rank) and finish cleanly: the right verdict is healthy, exit 0, never stopped.
"""

import argparse
import json
import os
import socket
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist


def line(rank: int, kind: str, **fields) -> str:
    event = {"v": 1, "t": time.time(), "mono": time.monotonic(), "rank": rank, "kind": kind}
    return json.dumps({**event, **fields}) + "\n"


def append(path: Path, *lines: str) -> None:
    with open(path, "a") as fh:
        fh.write("".join(lines))


def replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".forged.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def node_records(run: Path) -> dict[int, dict]:
    found = {}
    for path in run.glob("nodes/node-*/node.json"):
        try:
            data = json.loads(path.read_text())
            found[int(data["node_rank"])] = data
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def node_of(run: Path, ppid: int) -> int | None:
    return next((n for n, r in node_records(run).items() if r.get("torchrun_pid") == ppid), None)


def forge_exit(run: Path) -> None:
    append(
        run / "events" / "rank-1.jsonl",
        line(1, "error", exc_type="RuntimeError", message="forged: rank 1 failed", fatal=True),
        line(1, "exit", code=1, reason="exception"),
    )


def last_start(path: Path) -> dict | None:
    """The last collective_start line of an event file."""
    found = None
    for raw in path.read_text().splitlines():
        try:
            event = json.loads(raw)
        except ValueError:
            continue
        if event.get("kind") == "collective_start" and not event.get("p2p"):
            found = event
    return found


def forge_collective(run: Path) -> None:
    path = run / "events" / "rank-1.jsonl"
    last = last_start(path) or {"seq": 0, "group": "default"}
    start = dict(op="broadcast", seq=int(last["seq"]) + 1, group=last.get("group", "default"),
                 group_size=2, group_ranks=None, shapes=[[7, 3]], dtypes=["float32"],
                 is_async=False)  # fmt: skip
    append(path, line(1, "collective_start", **start))


def forge_error(run: Path) -> None:
    append(
        run / "events" / "rank-1.jsonl",
        line(
            1,
            "error",
            exc_type="RuntimeError",
            message="forged: rank 1 failed",
            fatal=True,
            thread="MainThread",
        ),
    )


def forge_steps(run: Path) -> None:
    steps = [line(1, "step", step=100_000 + i, step_time_s=0.25, forwards=1) for i in range(5)]
    append(run / "events" / "rank-1.jsonl", *steps)


def forge_pid(run: Path) -> None:
    hello = dict(world_size=8, local_rank=7, host=socket.gethostname(), pid=os.getpid(),
                 ppid=os.getppid())  # fmt: skip
    append(
        run / "events" / "rank-7.jsonl",
        line(7, "hello", **hello),
        line(7, "error", exc_type="RuntimeError", message="forged: rank 7 failed", fatal=True),
        line(7, "exit", code=1, reason="exception"),
    )


def forge_gone(run: Path, ppids: list[int]) -> None:
    """Rewrite the summary of the node rank 1 runs under, naming rank 1 gone, twice a second
    while the job runs (the node's launcher rewrites it every second)."""
    node = node_of(run, ppids[1])
    path = run / "nodes" / f"node-{node}" / "summary.json"
    while True:
        try:
            head, _, rest = path.read_text().partition("\n")
            data = json.loads(head)
        except (OSError, ValueError):
            time.sleep(0.2)
            continue
        data["gone"] = [1]
        data["seq"] = int(data.get("seq", 0)) + 1
        replace(path, json.dumps(data) + "\n" + rest)
        time.sleep(0.5)


def forge_row(data: dict, key: list | None) -> list | None:
    """The first row in a summary's head, made to name one more call: a broadcast of [7, 3] at
    `key` (group, number), by default the number after its latest call. Returns the key, or
    None where the summary has no row (yet)."""
    rows, calls = data.get("rows"), data.get("calls")
    if not isinstance(rows, dict) or not isinstance(calls, list) or not rows["rank"]:
        return None
    i = 0
    column = rows["same"] if "recent" in rows["same"] else None
    recent = column["recent"] if column is not None else rows["each"]["recent"][i]
    if not recent:
        return None
    latest = calls[recent[-1]]
    if key is None:
        key = [latest[1], latest[2] + 1]
    what = json.loads(latest[5])
    what[0] = [[7, 3]]  # its shapes
    calls.append(["broadcast", key[0], key[1], time.time(), 0.0, json.dumps(what)])
    forged = [n for n in recent if calls[n][1:3] != key] + [len(calls) - 1]
    if column is not None:
        column["recent"] = forged
    else:
        rows["each"]["recent"][i] = forged
    rows["last"][i] += 1  # (a row read already, by its line, is not read again)
    return key


def forge_rows(run: Path, seconds: float) -> None:
    """Rewrite node 1's summary (the one node 0's launcher reads) just after its launcher wrote
    it (its host and pid, the next write number), its rank's row naming a forged call: once
    (`seconds` 0), or
    for `seconds`: each write of the launcher at once (a 20 ms look), and its own again every
    0.3 s, numbered on. Writes run/forged-rows.json: the call, how many writes."""
    path = run / "nodes" / "node-1" / "summary.json"
    end = time.monotonic() + seconds
    key, mine, writes, first, written = None, None, 0, None, 0.0
    while True:
        try:
            head, _, rest = path.read_text().partition("\n")
            data = json.loads(head)
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        if first is None:
            first = head  # wait for the launcher's next write: forge it at once
        if head == first:
            time.sleep(0.02)
            continue
        if head != mine:  # the launcher's: forged anew, at once
            key = forge_row(data, key)
            if key is None:
                time.sleep(0.05)
                continue
        elif time.monotonic() - written < 0.3:
            time.sleep(0.02)
            continue
        else:  # its own, 0.3 s on: again, numbered on
            data["rows"]["last"] = [n + 1 for n in data["rows"]["last"]]
        data["seq"] = int(data["seq"]) + 1
        mine = json.dumps(data)
        replace(path, mine + "\n" + rest)
        written = time.monotonic()
        writes += 1
        (run / "forged-rows.json").write_text(json.dumps({"call": key, "writes": writes}))
        if written >= end:
            return


def forge_network(run: Path, seconds: float) -> None:
    """This node's network.json, written again and again while every rank stalls."""
    node = node_of(run, os.getppid())
    node = 0 if node is None else node
    host = socket.gethostname()
    addr = socket.gethostbyname(host)
    link = dict(rank=0, local=addr, local_port=40000, peer=addr, peer_port=29500,
                state="ESTABLISHED", send_q=65536, recv_q=0, retransmits=9, total_retrans=90,
                last_ack_ms=30000, segs_in=0, segs_out=0)  # fmt: skip
    look = dict(schema_version=1, node_rank=node, host=host, stalled_s=30.0,
                addresses=[["127.0.0.1", "lo", "down"], [addr, "eth0", "down"]],
                links=[link], probes=[dict(addr=addr, port=29500, answered=False,
                                           outcome="timeout", ms=3000.0)], names=[])  # fmt: skip
    path = run / "nodes" / f"node-{node}" / "network.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        replace(path, json.dumps({**look, "t": time.time()}))
        time.sleep(0.5)


def forge_peer_network(run: Path, seconds: float) -> None:
    """The other node's network.json, plausible: its own number and host, a link from its
    rank to this node's address that carries nothing, a probe of this node that timed out."""
    mine = node_of(run, os.getppid())
    records = node_records(run)
    other = next((n for n in records if n != mine), None)
    if other is None:
        return
    host = str(records[other].get("host") or socket.gethostname())
    addr = socket.gethostbyname(socket.gethostname())
    link = dict(rank=1, local="10.77.0.2", local_port=40001, peer=addr, peer_port=29500,
                state="ESTABLISHED", send_q=65536, recv_q=0, retransmits=9, total_retrans=90,
                last_ack_ms=30000, segs_in=0, segs_out=0)  # fmt: skip
    look = dict(schema_version=1, node_rank=other, host=host, stalled_s=30.0,
                addresses=[["10.77.0.2", "eth0", "up"]], links=[link],
                probes=[dict(addr=addr, port=29500, answered=False, outcome="timeout",
                             ms=3000.0)], names=[])  # fmt: skip
    path = run / "nodes" / f"node-{other}" / "network.json"
    (run / "forged-peernet.json").write_text(json.dumps(look))  # (for the test: it was written)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        replace(path, json.dumps({**look, "t": time.time()}))
        time.sleep(0.5)


def forge_beats(run: Path, seconds: float) -> None:
    """Rank 1 "blocked" by its heartbeats: no CPU, the same frame, beat after beat."""
    path = run / "events" / "rank-1.jsonl"
    end = time.monotonic() + seconds
    seq = 100_000
    while time.monotonic() < end:
        seq += 1
        append(path, line(1, "heartbeat", seq=seq, cpu_s=3.0, io_bytes=1000, runq_s=0.0,
                          frame="threading.py:320 wait", where="forge_claims.py:1 main",
                          open=None, errors=0, step=0))  # fmt: skip
        time.sleep(0.05)


def spin(seconds: float) -> None:
    """Busy in its own code (CPU) for `seconds`."""
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += sum(range(1000))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--forge", default="exit,pid")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--stall", type=float, default=0.0)
    args = parser.parse_args()
    forges = set(args.forge.split(","))
    run = Path(os.environ["DDPDOCTOR_RUN_DIR"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ppids = [0] * dist.get_world_size()
    dist.all_gather_object(ppids, os.getppid())
    value = torch.ones(4)
    rounds = int(args.seconds * 4)
    for i in range(rounds):
        dist.all_reduce(value)
        time.sleep(0.25)
        if rank == 0 and i == 8:
            if "exit" in forges:
                forge_exit(run)
            if "pid" in forges:
                forge_pid(run)
            if "runjson" in forges:
                data = json.loads((run / "run.json").read_text())
                replace(run / "run.json", json.dumps({**data, "world_size": 20_000_000}))
            if "collective" in forges:
                forge_collective(run)
            if "error" in forges:
                forge_error(run)
            if "steps" in forges:
                forge_steps(run)
            if "gone" in forges:
                threading.Thread(target=forge_gone, args=(run, ppids), daemon=True).start()
            for style, seconds in (("rows", 0.0), ("rowsloop", 8.0)):
                if style in forges:
                    threading.Thread(target=forge_rows, args=(run, seconds), daemon=True).start()
        if i == rounds // 2 and args.stall:
            if rank == 0 and "network" in forges:
                threading.Thread(target=forge_network, args=(run, args.stall), daemon=True).start()
            if rank == 0 and "peernet" in forges:
                threading.Thread(
                    target=forge_peer_network, args=(run, args.stall), daemon=True
                ).start()
            if "stallcall" in forges:
                # rank 1 computes while rank 0 waits for it in the next all_reduce: a wait, never
                # stopped; its "next call", forged, is a broadcast
                if rank == 0:
                    forge_collective(run)
                    if "beats" in forges:
                        threading.Thread(
                            target=forge_beats, args=(run, args.stall), daemon=True
                        ).start()
                else:
                    spin(args.stall)
            else:
                time.sleep(args.stall)  # every rank at once: no progress anywhere
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
