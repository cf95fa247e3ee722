"""The run directory's protocol: what ranks, launchers and watchers write and read there.

    rundir.py          the layout (run.json, events/, logs/, stacks/, nodes/, requests/, ...) and
                       its safe creation; atomic JSON writes
    events.py          the event schema of events/rank-<R>.jsonl and its tolerant line parser
    verdicts.py        the verdicts and rank states of diagnosis.json
    node_records.py    nodes/node-<I>/node.json: each launcher of a multi-node run
    stack_requests.py  requests/: one launcher asking another for its ranks' stacks
    torchrun_logs.py   what torchrun writes into logs/ and how to read it (rank files, agent lines)

May import: the shared vocabulary at the top of ddpdoctor (errors, findings, ...), nothing else.
"""
