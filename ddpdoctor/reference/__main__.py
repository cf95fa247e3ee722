"""`python -m ddpdoctor.reference [OPTIONS]`: the reference DDP job, run under torchrun."""

from __future__ import annotations

import sys

from ddpdoctor.reference.train import main

if __name__ == "__main__":
    sys.exit(main())
