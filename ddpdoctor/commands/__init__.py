"""One module per CLI command, each exposing `main(args) -> int`: parse, call, render.

May import: every package below (launch, monitor, explain, checks, distributed_doctor, tui, ...);
nothing imports the commands but ddpdoctor.cli.
"""
