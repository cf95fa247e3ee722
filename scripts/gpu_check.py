"""`make gpu-check`: ddpdoctor's NCCL path measured on a machine with an NVIDIA GPU, in one command.

    python scripts/gpu_check.py [--out DIR] [--budget SECONDS]
    python scripts/gpu_check.py --rehearse     # the same parts on CPU ranks with gloo (no GPU needed)

Within about seven minutes and with no other step, it runs, each part bounded in time:

  1. the tests marked `gpu` (pytest -m gpu);
  2. `ddpdoctor doctor --json` (the GPU, NCCL and NVML checks among the rest);
  3. the reference job on NCCL, one rank per GPU (one GPU: one rank), healthy;
  4. the same job with a hang injected into the last rank: the verdict, the culprit and its line,
     how long detection took, and whether the flight recorder's NCCL entries were read live
     (two GPUs or more: on one, the job's one rank has no peer waiting for it, and a lone rank
     that stops is "stalled", never a hang: a checkpoint or a download looks the same);
  5. the instrumented / plain step-time ratio of the reference job on the GPU
     (benchmarks/overhead.py case (a), interleaved pairs, median and spread).

Everything lands in DIR (default build/gpu-check): summary.json, one document, and summary.txt,
the short report it also prints. On a machine without an NVIDIA GPU it says so in one line and
exits 0 at once: it is safe to run anywhere. Its exit code is 1 when a part failed, else 0.

It uses the Python it runs under, so a machine whose `python3` holds torch needs no install: the
repository's own ddpdoctor is put first on the path of every process it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FRAME = re.compile(r"^[\w./-]+\.py:\d+ ")
PYTEST_SUMMARY = re.compile(
    r"^=* ?(.*\b(?:passed|failed|skipped|error|errors|deselected)\b.*?) ?=*$"
)


def gpu_names() -> list[str]:
    """The NVIDIA GPUs this machine has, as NVML names them; [] without one (or without NVML).
    Asked of NVML, or of nvidia-smi, never of torch: the answer must come at once."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            names = []
            for index in range(count):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
                names.append(name.decode() if isinstance(name, bytes) else str(name))
            return names
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML library, no driver: ask nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listed = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listed.returncode != 0:
        return []
    return [
        line.split(":", 1)[1].split("(")[0].strip()
        for line in listed.stdout.splitlines()
        if line.startswith("GPU ")
    ]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPDOCTOR_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(cmd: list[str], timeout: float, cwd: Path = REPO) -> tuple[int, str, float]:
    """(exit code, output, seconds); exit code 124 when it ran past `timeout` (its group killed)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        code = 124
    return code, out or "", time.monotonic() - start


def part_gpu_tests(budget: float, scratch: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    cmd += ["-o", "addopts=-ra", "tests"]
    code, out, took = run(cmd, budget)
    summary = next(
        (m[1] for line in reversed(out.splitlines()) if (m := PYTEST_SUMMARY.match(line.strip()))),
        out.strip().splitlines()[-1] if out.strip() else "",
    )
    ok = code in (0, 5)  # 5: pytest collected no test marked gpu
    return {
        "ok": ok,
        "exit_code": code,
        "seconds": round(took, 1),
        "summary": summary,
        "tail": out[-3000:],
    }


def part_doctor(budget: float, scratch: Path) -> dict[str, Any]:
    code, out, took = run([sys.executable, "-m", "ddpdoctor", "doctor", "--json"], budget)
    try:
        report = json.loads(out[out.index("{") :])
    except ValueError:
        return {"ok": False, "exit_code": code, "seconds": round(took, 1), "tail": out[-3000:]}
    (scratch / "doctor.json").write_text(json.dumps(report, indent=2))
    results = report.get("results", [])
    wanted = [
        r for r in results if str(r.get("group")) in ("gpu", "nccl") or "nvml" in str(r.get("id"))
    ]
    return {
        "ok": code in (0, 1),  # 1: a check failed, which the report itself says
        "exit_code": code,
        "seconds": round(took, 1),
        "counts": report.get("counts"),
        "gpu_nccl_nvml": [{k: r.get(k) for k in ("id", "status", "summary")} for r in wanted],
    }


BACKEND = ["nccl"]  # gloo when rehearsing on a machine without a GPU


def reference_run(
    budget: float, scratch: Path, ranks: int, name: str, extra: list[str]
) -> dict[str, Any]:
    run_dir = scratch / name
    cmd = [sys.executable, "-m", "ddpdoctor", "run", "--no-tui", "--no-doctor", "--json"]
    cmd += ["--backend", BACKEND[0], "--nproc", str(ranks), "--run-dir", str(run_dir), *extra]
    code, out, took = run(cmd, budget)
    try:
        diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    except (OSError, ValueError):
        diagnosis = {}
    findings = diagnosis.get("findings") or []
    culprits = sorted(diagnosis.get("culprits") or [])
    # The culprit's line: the innermost frame of its own code in its stack (library and native
    # frames are folded as "… N frames" by the stack grouping).
    lines = [
        next((f for f in reversed(stack.get("frames") or []) if FRAME.match(f)), "")
        for stack in diagnosis.get("stacks") or []
        if set(stack.get("ranks") or []) & set(culprits)
    ]
    recorder = diagnosis.get("flight_recorder") or {}
    flight_recorder = {
        str(rank): dump.get("summary") for rank, dump in recorder.items() if isinstance(dump, dict)
    }
    return {
        "exit_code": code,
        "seconds": round(took, 1),
        "verdict": diagnosis.get("verdict"),
        "detected_after_s": diagnosis.get("detected_after_s"),
        "culprits": culprits,
        "lines": [line for line in lines if line][:5],
        "findings": [f"{f.get('severity')} {f.get('id')}: {f.get('summary')}" for f in findings][
            :8
        ],
        "flight_recorder": flight_recorder,
        "tail": out[-2000:] if code not in (0, 1) else "",
    }


def part_healthy(budget: float, scratch: Path, ranks: int) -> dict[str, Any]:
    result = reference_run(budget, scratch, ranks, "healthy", ["--steps", "60"])
    result["ok"] = result["exit_code"] == 0 and result["verdict"] == "healthy"
    return result


def part_hang(budget: float, scratch: Path, ranks: int) -> dict[str, Any]:
    if ranks < 2:
        # NCCL refuses two ranks on one GPU, and a world of one has no peer that waits
        return {"ok": True, "skipped": "one GPU: a hang needs a rank that waits for the culprit"}
    culprit = ranks - 1
    spec = f"hang:rank={culprit},step=20"
    result = reference_run(budget, scratch, ranks, "hang", ["--steps", "400", "--inject", spec])
    result["injected"] = spec
    result["ok"] = (
        result["exit_code"] == 1
        and result["verdict"] == "hang"
        and result["culprits"] == [culprit]
        and bool(result["lines"])
    )
    return result


def part_overhead(budget: float, scratch: Path, ranks: int) -> dict[str, Any]:
    out_file = scratch / "overhead.json"
    cmd = [sys.executable, "benchmarks/overhead.py", "--only", "a", "--backend", BACKEND[0]]
    cmd += ["--nproc", str(ranks), "--reps", "3", "--steps", "120", "--json-out", str(out_file)]
    code, out, took = run(cmd, budget)
    try:
        case = json.loads(out_file.read_text())[0]
    except (OSError, ValueError, IndexError):
        return {"ok": False, "exit_code": code, "seconds": round(took, 1), "tail": out[-2000:]}
    return {
        "ok": code == 0,
        "exit_code": code,
        "seconds": round(took, 1),
        "wall": case["wall"],
        "cpu": case["cpu"],
        "events_per_rank_per_step": case["events_per_rank_per_step"],
    }


def text_report(summary: dict[str, Any]) -> str:
    parts = summary["parts"]
    lines = [
        f"gpu-check: {summary['gpus']} GPU(s): {', '.join(summary['gpu_names'])}; {summary['seconds']} s"
    ]
    tests = parts.get("gpu_tests", {})
    lines.append(
        f"  gpu tests       {'ok ' if tests.get('ok') else 'FAIL'} {tests.get('summary', '')}"
    )
    doctor = parts.get("doctor", {})
    checks = ", ".join(f"{r['id']} {r['status']}" for r in doctor.get("gpu_nccl_nvml", []))
    lines.append(
        f"  doctor          {'ok ' if doctor.get('ok') else 'FAIL'} {doctor.get('counts')}; {checks}"
    )
    for key in ("healthy", "hang"):
        r = parts.get(key, {})
        if "skipped" in r:
            lines.append(f"  {key:15} --  skipped: {r['skipped']}")
            continue
        lines.append(
            f"  {key:15} {'ok ' if r.get('ok') else 'FAIL'} verdict {r.get('verdict')} exit {r.get('exit_code')}"
            f" culprits {r.get('culprits')} after {r.get('detected_after_s')} s {' '.join(r.get('lines', [])[:1])}"
            f"; flight recorder read live on {len(r.get('flight_recorder') or {})} rank(s)"
        )
    over = parts.get("overhead", {})
    if "wall" in over:
        w = over["wall"]
        low, high = w["pair_overhead_pct"]
        lines.append(
            f"  overhead        ok  {w['plain_ms_per_step']:.2f} -> {w['instrumented_ms_per_step']:.2f} ms/step,"
            f" ratio {w['time_ratio']:.3f} (pairs {low:+.1f}% .. {high:+.1f}%)"
        )
    else:
        lines.append(f"  overhead        FAIL exit {over.get('exit_code')}")
    lines.append(
        f"  => {'all parts ok' if summary['ok'] else 'some part FAILED'}; details in {summary['out']}"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "gpu-check")
    parser.add_argument(
        "--budget", type=float, default=420.0, help="seconds for all parts together"
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="run every part on 2 CPU ranks with gloo, to try the check where no GPU is",
    )
    args = parser.parse_args()
    names = ["(rehearsal: CPU, gloo)"] * 2 if args.rehearse else gpu_names()
    if args.rehearse:
        BACKEND[0] = "gloo"
    if not names:
        print(
            "gpu-check: no NVIDIA GPU on this machine (NVML and nvidia-smi find none); nothing to check"
        )
        return 0
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    ranks = len(names)
    # The share of the budget each part may use at most; what one leaves over goes to the next.
    plan: list[tuple[str, float, Callable[[float, Path], dict[str, Any]]]] = [
        ("gpu_tests", 0.25, part_gpu_tests),
        ("doctor", 0.10, part_doctor),
        ("healthy", 0.15, lambda b, s: part_healthy(b, s, ranks)),
        ("hang", 0.20, lambda b, s: part_hang(b, s, ranks)),
        ("overhead", 0.30, lambda b, s: part_overhead(b, s, ranks)),
    ]
    parts: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-gpu-check-") as tmp:
        scratch = Path(tmp)
        for index, (name, share, part) in enumerate(plan):
            left = args.budget - (time.monotonic() - start)
            later = sum(s for _, s, _ in plan[index + 1 :])
            budget = max(20.0, left * share / (share + later))
            print(f"gpu-check: {name} (up to {budget:.0f} s)", flush=True)
            try:
                parts[name] = part(budget, scratch)
            except Exception as exc:  # noqa: BLE001 - one broken part must not lose the others
                parts[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        for kept in ("doctor.json", "overhead.json"):
            if (scratch / kept).is_file():
                shutil.copy(scratch / kept, args.out / kept)
    summary = {
        "schema_version": 1,
        "gpus": ranks,
        "gpu_names": names,
        "seconds": round(time.monotonic() - start, 1),
        "ok": all(p.get("ok") for p in parts.values()),
        "out": str(args.out),
        "parts": parts,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    report = text_report(summary)
    (args.out / "summary.txt").write_text(report + "\n")
    print(report)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
