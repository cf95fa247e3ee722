"""The reference job's earlier module path, kept because the README once told users to run
`python -m ddpdoctor.reference_job`: it is now `python -m ddpdoctor.reference`."""

from __future__ import annotations

import sys

from ddpdoctor.reference.train import main

if __name__ == "__main__":
    sys.exit(main())
