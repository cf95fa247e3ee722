"""Preflight checks: one module per group, a registry, a concurrent runner; checks never print.

    registry.py / runner.py   the checks and the one runner (`run_checks`) behind every doctor
    render.py / progress.py   the report as text, and the spinner while checks run
    probes/                   the facts of the machine behind small interfaces tests can feed

May import: the launchers' environments and the shared vocabulary.
"""
