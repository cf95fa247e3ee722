"""The reference DDP job: `python -m ddpdoctor.reference_job [OPTIONS]`, run under torchrun.

`ddpdoctor run` (without a script) launches it on every rank; plain
`torchrun --nproc-per-node 2 -m ddpdoctor.reference_job` runs it uninstrumented. The job lives in
ddpdoctor/reference/ (config, data, model, faults, train, verify).
"""

from __future__ import annotations

import sys

from ddpdoctor.reference.train import main

if __name__ == "__main__":
    sys.exit(main())
