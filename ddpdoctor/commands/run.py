"""`ddpdoctor run`: launch the reference DDP job, or a script of yours, under torchrun and watch it.

Everything is checked before anything starts (bad input: one error line, exit 2); see
ddpdoctor/launch.py for the run itself and its exit codes.
"""

from __future__ import annotations

import argparse

from ddpdoctor.launch import launch
from ddpdoctor.launch_plan import plan_from_args


def main(args: argparse.Namespace) -> int:
    return launch(plan_from_args(args))
