"""What a pytest selection costs in CPU, not only in wall time: the number that decides `make test` on 2 cores.

On a machine shared with other work the wall time says more about the neighbours than about the
suite. CPU-seconds do not: on C cores the suite cannot end before (CPU-seconds of pytest and of every
process it starts) / C, and a waiting-bound suite not before (sum of the tests' durations) / workers.
This script runs pytest with the given arguments and reports both, and which processes the CPU went to.

How the whole tree is counted: this process makes itself a child subreaper (Linux ``prctl``), so every
process pytest starts (xdist workers, ``dag.test()`` subprocesses, the emulated instances' agents and
their jobs, Airflow's processes), also one whose parent died first, ends as a descendant that is
reaped here; after pytest exits and every descendant is reaped, ``getrusage(RUSAGE_CHILDREN)`` holds
the exact CPU of the whole tree. The split by kind comes from sampling ``/proc/<pid>/stat`` every
``--sample`` seconds (a process shorter than one sample is missed there: it shows as "unattributed").
Per test, the CPU the worker and its reaped children spent in it (``tests/conftest.py`` writes one JSON
line per test when ``CLOUDTRAIN_TEST_CPU_LOG`` is set; the first test of a worker carries the session
fixtures' start: Airflow's DB, the emulator) and pytest's own ``--durations=0``.

    python benchmarks/suite_cost.py [--json out.json] [--top 25] -- tests/cloud/test_runs.py -n 2

Runs ``python -m pytest -p no:cacheprovider -q --durations=0 <args>``; give ``-n``/``-m`` yourself
(``make test`` uses ``-n 4 --dist worksteal -m "not faults"``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36
DURATION = re.compile(r"^([0-9.]+)s (call|setup|teardown)\s+(\S+)")

# first match wins: (kind, substring of the command line)
KINDS = (
    ("agent (emulated instance)", "airflow_cloudtrain.agent"),
    # forked agents keep their warm parent's command line (``emulator.agent_zygote``)
    ("agent (emulated instance)", "airflow_cloudtrain.emulator.agent_zygote"),
    ("dag.test() subprocess", "dag_helpers"),
    # workers forked from their warm parent keep its command line (``tests/worker_zygote.py``)
    ("pytest/xdist worker", "worker_zygote"),
    ("pytest/xdist worker", "pytest"),
    ("pytest/xdist worker", "execnet"),
    ("pytest/xdist worker", "exec(eval(sys.stdin.readline()))"),
    ("first tries (tests/try_zygote.py and its forks)", "try_zygote"),
    ("browser (chromium)", "chromium"),
    ("airflow api-server", "api-server"),
    ("airflow api-server", "api_server"),
    ("airflow scheduler", "scheduler"),
    ("airflow dag-processor", "dag-processor"),
    ("airflow dag-processor", "dag_processor"),
    ("airflow triggerer", "triggerer"),
    ("airflow worker / task", "airflow worker"),
    ("airflow worker / task", "supervise"),
    ("airflow process", "airflow"),
    ("cloudtrain cli", "cloudtrain"),
    ("job (bash/python run by an agent)", "bash"),
    ("moto server", "moto"),
)


def _kind(cmdline: str) -> str:
    return next((kind for kind, needle in KINDS if needle in cmdline), "other")


def _stat(pid: str) -> tuple[int, int, int] | None:
    """(ppid, utime+stime ticks, start time) of one process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])


class Sampler(threading.Thread):
    """The last CPU seen of every descendant of ``root``, with its kind."""

    def __init__(self, root: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s = root, every_s
        self.seen: dict[tuple[int, int], tuple[str, int]] = {}  # (pid, start) -> (kind, ticks)
        self.peak = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def sample(self) -> None:
        stats: dict[int, tuple[int, int, int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (got := _stat(name)) is not None:
                stats[int(name)] = got
        children: defaultdict[int, list[int]] = defaultdict(list)
        for pid, (ppid, _, _) in stats.items():
            children[ppid].append(pid)
        todo, tree = [self.root], []
        while todo:
            parent = todo.pop()
            for child in children.get(parent, []):
                tree.append(child)
                todo.append(child)
        self.peak = max(self.peak, len(tree))
        for pid in tree:
            _, ticks, start = stats[pid]
            key = (pid, start)
            kind = self.seen.get(key, ("", 0))[0]
            if not kind:
                try:
                    kind = _kind(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
                except OSError:
                    continue
            self.seen[key] = (kind, ticks)

    def by_kind(self) -> dict[str, tuple[int, float]]:
        """kind -> (processes, CPU-seconds seen)."""
        count: Counter[str] = Counter()
        cpu: defaultdict[str, float] = defaultdict(float)
        for kind, ticks in self.seen.values():
            count[kind] += 1
            cpu[kind] += ticks / TICK
        return {kind: (count[kind], cpu[kind]) for kind in cpu}


def _reap_all(grace_s: float) -> int:
    """Reap every descendant (orphans come to this subreaper); the number still alive after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            if time.monotonic() >= deadline:
                return len([p for p in os.listdir("/proc") if p.isdigit() and _is_child(int(p))])
            time.sleep(0.2)


class Reaper(threading.Thread):
    """Reaps the orphans that come to this subreaper while pytest runs, as init would: a test that waits
    for a process it stopped to be gone (``psutil.pid_exists``) would otherwise see a zombie for ever.
    ``keep`` (pytest itself) is left for ``Popen.wait``."""

    def __init__(self, keep: int) -> None:
        super().__init__(name="reaper", daemon=True)
        self.keep = keep
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is None or info.si_pid == self.keep:
                self.done.wait(0.2)
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)


def _is_child(pid: int) -> bool:
    got = _stat(str(pid))
    return got is not None and got[0] == os.getpid()


def durations(log: str) -> tuple[dict[str, float], dict[str, float]]:
    """Per test (setup+call+teardown) and per file, from pytest's ``--durations=0`` lines."""
    per_test: defaultdict[str, float] = defaultdict(float)
    for line in log.splitlines():
        if m := DURATION.match(line):
            per_test[m[3]] += float(m[1])
    per_file: defaultdict[str, float] = defaultdict(float)
    for test, seconds in per_test.items():
        per_file[test.split("::", 1)[0]] += seconds
    return dict(per_test), dict(per_file)


def per_test_cpu(path: Path) -> dict[str, float]:
    """Test -> CPU-seconds (the worker's own and its reaped children's), from ``tests/conftest.py``'s log."""
    out: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out[row["test"]] = row["cpu_s"] + row["children_cpu_s"]
    return out


def _workers(args: list[str]) -> int:
    for i, arg in enumerate(args):
        if arg == "-n" and i + 1 < len(args) and args[i + 1].isdigit():
            return max(1, int(args[i + 1]))
        if arg.startswith("-n") and arg[2:].isdigit():
            return max(1, int(arg[2:]))
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--log", type=Path, help="keep pytest's output here (default: a temp file)")
    parser.add_argument("--top", type=int, default=20, help="slowest tests and files to list")
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between /proc samples")
    parser.add_argument("--cores", type=int, default=2, help="cores the wall-time estimate is for")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    args = [a for a in opts.pytest_args if a != "--"]

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    log_path = opts.log or Path(f"/tmp/suite_cost-{os.getpid()}.log")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--durations=0", *args]
    cpu_log = log_path.with_suffix(".cpu.jsonl")
    cpu_log.unlink(missing_ok=True)
    env = {**os.environ, "CLOUDTRAIN_TEST_CPU_LOG": str(cpu_log)}
    load_before = os.getloadavg()
    start = time.monotonic()
    with log_path.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        sampler = Sampler(os.getpid(), opts.sample)
        sampler.start()
        reaper = Reaper(proc.pid)
        reaper.start()
        rc = proc.wait()
        reaper.done.set()
        reaper.join()
    wall = time.monotonic() - start
    left = _reap_all(grace_s=30.0)
    sampler.stop()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    log = log_path.read_text()
    per_test, per_file = durations(log)
    test_cpu = per_test_cpu(cpu_log)
    file_cpu: defaultdict[str, float] = defaultdict(float)
    for test, seconds in test_cpu.items():
        file_cpu[test.split("::", 1)[0]] += seconds
    workers = _workers(args)
    summed = sum(per_test.values())
    kinds = sampler.by_kind()
    attributed = sum(c for _, c in kinds.values())
    estimate = max(cpu / opts.cores, summed / workers)

    tail = [line for line in log.splitlines() if re.search(r"\b(passed|failed|error)", line)][-1:]
    print(f"pytest {' '.join(args)}  (rc {rc}; {tail[0] if tail else 'no summary'})")
    print(f"load average before: {load_before[0]:.1f}, after: {os.getloadavg()[0]:.1f}")
    print(
        f"wall {wall:.0f} s; CPU of the whole tree {cpu:.0f} s (user {usage.ru_utime:.0f}, sys {usage.ru_stime:.0f})"
    )
    print(
        f"sum of test durations {summed:.0f} worker-seconds over {workers} worker(s), {len(per_test)} tests"
    )
    print(
        f"estimated wall on {opts.cores} cores: max(CPU/{opts.cores} = {cpu / opts.cores:.0f}, "
        f"durations/{workers} = {summed / workers:.0f}) = {estimate:.0f} s"
    )
    if left:
        print(f"WARNING: {left} descendant(s) still alive 30 s after pytest ended (not counted)")
    print(f"\nCPU by process kind (sampled every {opts.sample:g} s; peak {sampler.peak} processes):")
    for kind, (n, c) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"  {c:8.1f} s  {n:5d} processes  {kind}")
    print(f"  {max(0.0, cpu - attributed):8.1f} s  unattributed (processes shorter than a sample)")
    print(f"  tests' own (worker + reaped children, per test): {sum(test_cpu.values()):.0f} s; the rest is")
    print("  start-up, collection and workers' imports (and processes reaped outside any test)")
    print("\nfiles by CPU (worker + children during their tests) and by duration:")
    for path, c in sorted(file_cpu.items(), key=lambda kv: -kv[1])[: opts.top]:
        print(f"  {c:8.1f} s CPU  {per_file.get(path, 0.0):8.1f} s wall  {path}")
    print("\ntests by CPU, with their duration:")
    for test, c in sorted(test_cpu.items(), key=lambda kv: -kv[1])[: opts.top]:
        print(f"  {c:8.1f} s CPU  {per_test.get(test, 0.0):8.1f} s wall  {test}")
    if opts.json:
        opts.json.write_text(
            json.dumps(
                {
                    "args": args,
                    "rc": rc,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "durations_sum_s": summed,
                    "workers": workers,
                    "estimate_s": estimate,
                    "by_kind": {k: {"processes": n, "cpu_s": c} for k, (n, c) in kinds.items()},
                    "per_file": per_file,
                    "per_test": per_test,
                    "per_test_cpu": test_cpu,
                    "per_file_cpu": dict(file_cpu),
                },
                indent=1,
            )
        )
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
