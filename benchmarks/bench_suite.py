"""The test suite's time against its targets: the quick tier under 2 minutes, the full suite under 15 (issue 35).

Run it from the repository root, on a machine doing nothing else:

```bash
python benchmarks/bench_suite.py                  # both tiers, as the README's test command runs them
python benchmarks/bench_suite.py --tier quick     # the quick tier alone (about a minute)
python benchmarks/bench_suite.py --tier quick -- tests/test_words.py -n 0   # after --: pytest's own arguments
```

What it measures: each tier run as ``pytest`` in a child process, with ``CI=true`` as CI runs it (a
missing browser fails there rather than skipping), the quick tier with ``-m "not slow"``; its wall time,
the whole machine's busy CPU seconds over it (from /proc/stat, so every process the tests start counts:
the browsers, the app servers, Ray) and its tests' outcomes. This file is also the pytest plugin the
child loads (``-p bench_suite``): each test worker appends every test's time and the worker's own CPU
time to a log, summed here by module. While a tier runs, every process started after it began is read
from /proc every half second (`ProcessSampler`), and its CPU time summed by kind (chromium by its
process type, the app servers, the test workers, heavy-work processes, Ray, ...): what a machine's
time goes to, to set beside another machine's.

The suite is bound by the CPU on two cores, so its time follows the cores' speed: the machine line names
the CPU as these machines differ (family and model, AVX2, AVX-512, AMX) and Python's own speed, the best
of 20 runs of ``sum(range(10**6))``; a figure is read beside them. The last line is exactly
``suite_quick_s=<s> suite_full_s=<s> suite_full_cpu_s=<s>``, ``nan`` for a tier not run.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOG = "ATTNVIZ_SUITE_LOG"  # the child's workers append one JSON line per test here
TARGETS_S = {"quick": 120.0, "full": 900.0}
TIERS = {"quick": ["-m", "not slow"], "full": []}


# ---------------------------------------------------------------------------------------------
# The plugin, in the child's test processes


_log_path: str | None = None  # read once, as the process starts: a test may clear attnviz's settings from its env


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pytest_configure(config):  # noqa: ARG001 - pytest's signature
    """The log's path, before any test runs. Read at each test, it was lost to every later test of a worker
    once a test had emptied the environment of ``ATTNVIZ_`` settings (a check of what a heavy-work process
    does as it starts did, `attnviz.jobs`): a full run logged 2,176 of its 2,683 tests."""
    global _log_path
    _log_path = os.environ.get(LOG)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001 - pytest's signature
    """Around each test (setup, call and teardown): its wall time and this process's CPU time, logged."""
    wall, cpu = time.perf_counter(), _cpu_s()
    try:
        return (yield)
    finally:
        path = _log_path
        if path:
            record = {
                "module": item.nodeid.split("::", 1)[0],
                "wall": time.perf_counter() - wall,
                "cpu": _cpu_s() - cpu,
            }
            # one short line a write, opened to append: the two workers' lines do not interleave
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------------------------------------
# The machine


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (user, nice, system, irq, softirq), from /proc/stat."""
    with open("/proc/stat", encoding="utf-8") as f:
        fields = f.readline().split()
    return sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / os.sysconf("SC_CLK_TCK")


def describe_cpu() -> str:
    """The CPU's name, family and model, and the vector units that tell these machines apart."""
    from attnviz.devices import cpu_flags  # here, not at the top: the plugin's test workers do not need it

    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    flags = cpu_flags() or frozenset()
    units = [name for name, flag in (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AVX-512 bf16", "avx512_bf16"),
                                     ("AMX bf16", "amx_bf16")) if flag in flags]  # fmt: skip
    return (
        f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')}, model "
        f"{info.get('model', '?')}), {os.cpu_count()} cores, {', '.join(units) or 'no AVX2'}"
    )


def python_ms() -> float:
    """The best of 20 runs of ``sum(range(10**6))``, ms: how fast this machine runs Python right now."""
    best = math.inf
    for _ in range(20):
        start = time.perf_counter()
        sum(range(10**6))
        best = min(best, time.perf_counter() - start)
    return best * 1000


# ---------------------------------------------------------------------------------------------
# The processes a tier starts, by kind

SAMPLE_S = 0.5  # how often /proc is read: a process's last half second, or a shorter one, is missed
XDIST_WORKER = "exec(eval(sys.stdin.readline()))"  # how execnet starts a pytest-xdist worker: python -c this


def process_kind(cmdline: bytes) -> str:
    """What a process of a test run is, from its /proc cmdline (NUL-separated words; chromium and nginx
    rewrite theirs into one string with spaces)."""
    words = cmdline.replace(b"\0", b" ").decode(errors="replace").split()
    if not words:
        return "other"
    program = Path(words[0].rstrip(":")).name
    head = words[:3]  # the program, and the script or module a Python runs
    if "chrom" in program:
        return "chromium " + next((w.split("=", 1)[1] for w in words if w.startswith("--type=")), "browser")
    if program == "node":
        return "playwright's driver (node)"
    if program in ("raylet", "gcs_server") or any("/ray/" in w or w.endswith("/ray") for w in head):
        return "Ray"
    if program.startswith("nginx"):
        return "nginx"
    if program.startswith("redis"):
        return "redis"
    if not program.startswith("python"):
        return "other"
    if "streamlit" in head and "run" in words:
        return "app servers (streamlit run)"
    if "attnviz.jobs" in head:
        return "heavy-work processes (attnviz.jobs)"
    if any("jupyter" in w or "ipykernel" in w for w in head):
        return "Jupyter servers and kernels"
    if XDIST_WORKER in " ".join(words) or "pytest" in head or any(w.endswith("bin/pytest") for w in head):
        return "test workers and pytest"
    return "Python, other"


class ProcessSampler:
    """Every process started after this was made, read from /proc at each `sample`: its kind and CPU seconds
    (its own user and system time, not its children's), kept after it ends at its last reading."""

    def __init__(self):
        self.tick = os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime", encoding="utf-8") as f:
            uptime = float(f.read().split()[0])
        # In clock ticks since boot, as /proc/PID/stat gives a process's start; half a second early, as the two
        # clocks are rounded apart (a process started right after was once left out). This process is not counted.
        self.since = (uptime - 0.5) * self.tick
        self.seen: dict[tuple[int, int], list] = {}  # (pid, its start) -> [kind, CPU s, its command line]

    def sample(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()  # after the command's name, which may hold spaces
                start = int(fields[19])
                if start < self.since:
                    continue
                key = (int(name), start)
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = f.read()
                # Told again when its command line changes: seen between its fork and its exec, a process shows its
                # parent's. An ended process not yet waited for (a zombie) shows an empty one: it stays what it was.
                if key not in self.seen or (cmdline and self.seen[key][2] != cmdline):
                    self.seen[key] = [process_kind(cmdline), 0.0, cmdline]
                self.seen[key][1] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, IndexError, ValueError):  # it ended while being read
                continue

    def by_kind(self) -> dict[str, tuple[int, float]]:
        """Each kind's processes and CPU seconds, the most CPU first."""
        counts, cpu = collections.Counter(), collections.Counter()
        for kind, seconds, _ in self.seen.values():
            counts[kind] += 1
            cpu[kind] += seconds
        return {kind: (counts[kind], seconds) for kind, seconds in cpu.most_common()}


# ---------------------------------------------------------------------------------------------
# A tier


def outcome(output: str) -> str:
    """pytest's summary of a run ("2678 passed, 13 skipped"), from its last line."""
    for line in reversed(output.strip().splitlines()):
        found = re.match(
            r"=*\s*(\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b.*?) in [\d.]+s", line
        )
        if found:
            return found.group(1)
    return "no summary"


def run_tier(tier: str, extra: list[str]) -> dict:
    """Run ``pytest`` for ``tier`` in a child process: its wall time, the machine's CPU over it, its return code,
    summary and output, and its tests' records."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "tests.jsonl"
        log.touch()
        env = {**os.environ, "CI": "true", LOG: str(log)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "pytest", "-q", "-p", "bench_suite", *TIERS[tier], *extra]
        output_file = Path(folder) / "output.txt"
        sampler = ProcessSampler()
        cpu, start = machine_cpu_s(), time.perf_counter()
        with open(output_file, "wb") as out:  # a file, not a pipe: nothing here reads while the tier runs
            child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                while child.poll() is None:
                    sampler.sample()
                    time.sleep(SAMPLE_S)
            finally:  # interrupted: the tier stops with this
                if child.poll() is None:
                    child.kill()
                    child.wait()
        wall, cpu = time.perf_counter() - start, machine_cpu_s() - cpu
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        output = output_file.read_text(errors="replace")
    return {"wall": wall, "cpu": cpu, "rc": child.returncode, "summary": outcome(output), "output": output,
            "records": records, "processes": sampler.by_kind()}  # fmt: skip


def print_modules(tier: str, records: list[dict], top: int) -> None:
    wall, cpu, tests = collections.Counter(), collections.Counter(), collections.Counter()
    for record in records:
        wall[record["module"]] += record["wall"]
        cpu[record["module"]] += record["cpu"]
        tests[record["module"]] += 1
    total = sum(wall.values()) or 1.0
    print(f"\n  the {min(top, len(wall))} longest modules of the {tier} tier, summed over their tests "
          f"({total:.1f} s over every worker)")  # fmt: skip
    print(f"  {'module':36} {'tests':>5} {'time s':>8} {'share':>6} {'worker CPU s':>12}")
    for module, seconds in wall.most_common(top):
        print(f"  {module:36} {tests[module]:5d} {seconds:8.2f} {seconds / total:6.1%} {cpu[module]:12.2f}")
    print("  (worker CPU: the test process's own; the browsers, servers and other processes a test starts "
          "are in the machine's CPU above)")  # fmt: skip


def print_processes(tier: str, kinds: dict[str, tuple[int, float]], machine_cpu: float) -> None:
    sampled = sum(seconds for _, seconds in kinds.values())
    print(f"\n  CPU by process, over the processes the {tier} tier started (read every {SAMPLE_S:g} s: "
          "a process's last moment, or a shorter one, is missed)")  # fmt: skip
    print(f"  {'kind':40} {'processes':>9} {'CPU s':>8} {'share':>6}")
    for kind, (count, seconds) in kinds.items():
        print(f"  {kind:40} {count:9d} {seconds:8.1f} {seconds / (sampled or 1.0):6.1%}")
    print(f"  {sampled:.0f} CPU s read of the machine's {machine_cpu:.0f} over the tier")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", default="quick,full", help="quick, full or both (quick,full)")
    parser.add_argument("--top", type=int, default=12, help="how many modules to list (of the full tier when run)")
    args = parser.parse_args(argv)
    tiers = [t for t in args.tier.split(",") if t]
    if not tiers or any(t not in TIERS for t in tiers):
        parser.error(f"--tier: quick, full or quick,full, not {args.tier!r}")

    print(f"attnviz suite benchmark | {describe_cpu()} | python {sys.version.split()[0]}")
    print(f"Python's speed here: sum(range(10**6)) in {python_ms():.1f} ms (best of 20)")
    print("the whole machine's CPU counts: run it on a machine doing nothing else")
    if extra:
        print(f"pytest's arguments added: {' '.join(extra)}")
    print(f"\n  {'tier':6} {'tests':34} {'wall s':>8} {'machine CPU s':>14} {'busy':>5}  "
          "verdict (target)")  # fmt: skip
    results, failed = {}, False
    for tier in tiers:
        result = results[tier] = run_tier(tier, extra)
        busy = result["cpu"] / (result["wall"] * (os.cpu_count() or 1))
        target = TARGETS_S[tier]
        verdict = "PASS" if result["wall"] <= target else "MISS"
        figures = f"{result['wall']:8.1f} {result['cpu']:14.0f} {busy:5.0%}"
        print(f"  {tier:6} {result['summary'][:34]:34} {figures}  {verdict} (<= {target:.0f} s)", flush=True)
        if result["rc"] != 0:
            failed = True
            print(f"  pytest exited with {result['rc']}; its last lines:\n" + result["output"][-3000:])
    shown = "full" if "full" in results else tiers[0]
    print_modules(shown, results[shown]["records"], args.top)
    print_processes(shown, results[shown]["processes"], results[shown]["cpu"])
    quick, full = (results.get(t, {}).get("wall", math.nan) for t in ("quick", "full"))
    full_cpu = results.get("full", {}).get("cpu", math.nan)
    print(f"suite_quick_s={quick:.1f} suite_full_s={full:.1f} suite_full_cpu_s={full_cpu:.0f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
