"""What one long, hostile line costs ddpdoctor's matchers: `explain`, the live log panel's
classifier and torchrun's log parser, on lines of 10 KB and 1 MB built to make regular expressions
backtrack. Linear matching (and the 4 KiB cut before matching) keeps the 1 MB cost near the 10 KB
cost; the ratio column is the check.

    python benchmarks/long_lines.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

from ddpdoctor.explain import classify_line, explain_lines
from ddpdoctor.protocol.torchrun_logs import AgentLogParser

FAMILIES = {
    "NCCL + a": ("NCCL ", "a"),
    "[a]: tags": ("", "[a]:"),
    "torchrun tags": ("[default0]:", "[a]:"),
    "NCCL header": ("vm:1:1 [0] NCCL INFO ", "a_"),
    "version digits": ("NCCL version ", "0"),
    "traceback": ('  File "', "a."),
}


def cost(text: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        explain_lines([text])
        classify_line(text)
        AgentLogParser().feed(text, 1)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'family':16} {'10 KB':>10} {'1 MB':>10} {'ratio':>7}")
    for name, (prefix, unit) in FAMILIES.items():
        small = cost(prefix + unit * (10_000 // len(unit)), args.repeat)
        large = cost(prefix + unit * (1_000_000 // len(unit)), args.repeat)
        print(f"{name:16} {small * 1e3:8.2f}ms {large * 1e3:8.2f}ms {large / small:7.1f}")


if __name__ == "__main__":
    main()
