"""Python stacks of the ranks, in one place: py-spy captures, their grouping, and who asks whom.

    capture.py     run py-spy on local pids (bounded, ptrace denial explained), save stacks/
    groups.py      parse py-spy dumps, fold library frames, group identical stacks across ranks
    collector.py   the monitor's captures: local pids directly, other nodes' ranks by request
    responder.py   a launcher answering other launchers' requests for its ranks' stacks

May import: the protocol (stack requests, run directory) and the shared vocabulary.
"""
