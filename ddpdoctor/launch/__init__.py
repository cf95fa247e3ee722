"""Everything `ddpdoctor run` does around the job: plan it, start it, supervise it, stop it.

    plan.py               the flags -> a LaunchPlan (validated before anything starts), run.json
    torchrun_cmd.py       the torchrun command line and the job's environment
    torchrun_process.py   torchrun's process tree: start, output, stop, kill; nothing outlives it
    supervise.py          the stop policy applied on every poll of the monitor's verdict
    launcher.py           run directory -> doctor -> torchrun -> watch -> closing lines, exit code

May import: the checks (the run's doctor), the reference job's options and fault specs, stacks,
the protocol, the launchers' environments and the shared vocabulary. Never the monitor, the TUI
or the commands: the command passes the watchers in (launcher.Watchers).
"""
