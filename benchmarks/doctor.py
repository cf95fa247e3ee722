"""How fast is `ddpdoctor doctor`, against `python -m torch.utils.collect_env` on the same machine?

The three commands run interleaved (collect_env, doctor --no-smoke, doctor with the 2-rank gloo
smoke test), several times each, so a busy machine slows them alike; the medians are compared:

    doctor --no-smoke / collect_env   at most 1.0 (target 0.5)
    doctor with smoke / collect_env   at most 3.0

Also reports whether `doctor --no-smoke` imported torch (it must not, unless a GPU is present).

    python benchmarks/doctor.py [--reps N] [--strict]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT_NO_SMOKE, TARGET_NO_SMOKE, LIMIT_SMOKE = 1.0, 0.5, 3.0
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)

COMMANDS = {
    "collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
    "doctor --no-smoke": [sys.executable, "-m", "ddpdoctor", "doctor", "--no-smoke"],
    "doctor (smoke)": [
        sys.executable,
        "-m",
        "ddpdoctor",
        "doctor",
        "--nproc",
        "2",
        "--backend",
        "gloo",
    ],
}


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: the doctor found problems on this machine, still timed
        sys.exit(f"{' '.join(cmd)} exited with {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed


def imports_torch(env: dict[str, str]) -> bool:
    cmd = [sys.executable, "-X", "importtime", "-m", "ddpdoctor", "doctor", "--no-smoke"]
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    modules = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    return any(m == "torch" or m.startswith("torch.") for m in modules)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="runs of each command (default 5)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a limit is exceeded")
    args = parser.parse_args()
    env = environment()
    for cmd in COMMANDS.values():  # warm the page cache once, untimed
        timed(cmd, env)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.reps):
        for name, cmd in COMMANDS.items():
            samples[name].append(timed(cmd, env))
    medians = {name: statistics.median(times) for name, times in samples.items()}
    base = medians["collect_env"]
    no_smoke = medians["doctor --no-smoke"] / base
    with_smoke = medians["doctor (smoke)"] / base
    print(f"ddpdoctor doctor benchmark: {args.reps} interleaved runs each, medians")
    for name, median in medians.items():
        runs = ", ".join(f"{t:.2f}" for t in samples[name])
        print(f"  {name:<18} {median:6.2f} s   (runs: {runs})")
    torch_loaded = imports_torch(env)
    ok_no_smoke, ok_smoke = no_smoke <= LIMIT_NO_SMOKE, with_smoke <= LIMIT_SMOKE
    target = "target met" if no_smoke <= TARGET_NO_SMOKE else f"target {TARGET_NO_SMOKE} missed"
    print(
        f"  ratio doctor --no-smoke / collect_env: {no_smoke:.2f} "
        f"(limit {LIMIT_NO_SMOKE}, {target}) {'ok' if ok_no_smoke else 'OVER LIMIT'}"
    )
    print(
        f"  ratio doctor with smoke / collect_env: {with_smoke:.2f} "
        f"(limit {LIMIT_SMOKE}) {'ok' if ok_smoke else 'OVER LIMIT'}"
    )
    print(f"  doctor --no-smoke imports torch: {'yes' if torch_loaded else 'no'}")
    within = ok_no_smoke and ok_smoke
    return 0 if within or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
