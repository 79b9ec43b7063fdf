"""Issue 24's check with the real frameworks: the agent's CheckpointSync against what they really write.

For each framework (``framework_jobs.py``: Lightning, Hugging Face ``Trainer``, Orbax, DCP, plain
``torch.save``): the job trains a tiny model (GPU when there is one) into a checkpoint directory while
this process runs ``CheckpointSync.sync()`` every 0.3 s into an in-memory run folder. At a random
point after its second save the job is killed (SIGKILL; Lightning with SIGTERM), then, as the agent
does: ``job_ended(at, killed=True)``, one last ``sync()``. The killed directory is moved aside and
``restore()`` fills a fresh one at the same path (a relaunched instance has the same
``$CLOUDTRAIN_CHECKPOINT_DIR``); the job is started again with the framework's own resume API and
runs to the end. Checked:

- the resumed job loads what was restored (exit 0: no torn or missing file);
- the step it resumes from is the manifest's step (layouts with steps) and a step the job had
  completely saved (it printed ``saved N`` after the save returned);
- it is the newest such step, except where the agent deliberately keeps the previous version: a file
  written in place (Lightning's ``.ckpt`` files, ``checkpoint.pt``) that the killed job changed after
  the agent's last look at the live job is taken as torn, so the step must then be at least the
  newest one saved before the last sync round that ended before the kill began.

Prints (and writes to ``--out``) a table: framework, the names written (in order of first sight,
steps generalised), versions uploaded, resumed step, result; and what ``plan`` left out.
``python framework_checkpoints.py [--only lightning,dcp] [--out DIR] [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Job, MemoryFolder, SyncLoop, Watcher, new_sync, reap_on_exit, table  # noqa: E402

from airflow_cloudtrain.contract import runs  # noqa: E402

JOBS = Path(__file__).resolve().parent / "framework_jobs.py"
FRAMEWORKS = ["lightning", "huggingface", "orbax", "dcp", "torchsave"]
IN_PLACE = {"lightning", "torchsave"}  # written in place: a write after the last live look is torn
NO_STEP = {"torchsave"}  # a snapshot of loose files: the manifest has no step
SIGNALS = {"lightning": signal.SIGTERM}  # the rest: SIGKILL


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in (
        "torch",
        "lightning",
        "pytorch-lightning",
        "transformers",
        "accelerate",
        "jax",
        "orbax-checkpoint",
    ):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "-"
    return out


def check(framework: str, work: Path, rng: random.Random, steps: int, every: int, step_s: float) -> dict:
    """One framework: train, sync, kill, last sync, restore into a fresh directory, resume; a row."""
    ckpt = work / framework / "ckpt"
    ckpt.mkdir(parents=True)
    log = work / f"{framework}.log"
    folder, notes = MemoryFolder(), []
    sync = new_sync(folder, ckpt, notes)
    row: dict = {"framework": framework, "problems": []}
    cmd = [sys.executable, str(JOBS), framework, "--ckpt", str(ckpt), "--steps", str(steps)]
    cmd += ["--every", str(every), "--step-s", str(step_s)]
    watcher, loop = Watcher(ckpt), SyncLoop(sync, 0.3)
    watcher.start()
    job = Job(cmd, log)
    sync.job_started(job.proc.pid)  # as the agent: a look is trusted only while the job is alive
    loop.start()
    # a random point after the second save, before the last one
    target = rng.randint(2, max(2, steps // every - 3))
    if not job.wait_for(r"^saved \d+", 240, count=target):
        loop.stop(), watcher.stop()
        rc = job.finish(10)
        row["problems"].append(f"job ended (rc {rc}) or stalled before {target} saves")
        row["result"] = "FAIL"
        return row
    time.sleep(rng.uniform(0, every * step_s))
    sig = SIGNALS.get(framework, signal.SIGKILL)
    killed_at = time.time()
    os.killpg(job.proc.pid, sig)
    job.finish(60)
    ended = time.time()
    loop.stop()
    sync.job_ended(ended, killed=True)
    sync.sync()  # the agent's last round after the job ended
    watcher.stop()
    row["signal"] = sig.name
    row["names"] = watcher.names()
    row["versions"] = folder.manifests_written()
    row["sync_errors"] = loop.errors
    saves = [
        (int(line.split()[1]), float(line.split()[3])) for line in job.lines if line.startswith("saved ")
    ]
    row["saved"] = [s for s, _ in saves]
    manifest = sync.last_manifest
    row["manifest_step"] = manifest.step if manifest else None
    row["layout"] = manifest.layout if manifest else None
    row["units"] = [f"{u['layout']}:{u['name']}" for u in (manifest.units if manifest else [])]
    left = folder.get_text(runs.LEFT_OUT_KEY)
    row["left_out"] = json.loads(left).get("pending", []) if left else []
    # relaunch: the killed directory aside, a fresh one at the same path, restored by the agent
    shutil.move(str(ckpt), str(ckpt.with_name("ckpt.killed")))
    restore = new_sync(folder, ckpt, [])
    restored = restore.restore()
    row["restored_step"] = restored.step if restored else None
    row["restored_files"] = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())
    watcher2 = Watcher(ckpt)
    watcher2.start()
    resumed = Job(cmd + ["--resume"], log)
    rc = resumed.finish(300)
    watcher2.stop()
    row["resume_rc"] = rc
    starts = resumed.ints(r"^resumed from step (\d+)")
    row["resumed"] = starts[0] if starts else None
    row["new_names"] = [n for n in watcher2.names() if n not in row["names"]]
    done = resumed.ints(r"^done (\d+)")
    looked = max((b for b, e in loop.spans if e < killed_at), default=float("-inf"))
    judge(row, saves, looked, done, steps)
    return row


def judge(row: dict, saves: list[tuple[int, float]], looked: float, done: list[int], steps: int) -> None:
    """What a user would check after the relaunch; every failed check is a problem in the row.
    ``looked``: when the last sync round that ended before the kill began (it saw every save that
    had finished by then, with the job alive)."""
    problems = row["problems"]
    framework, got = row["framework"], row["resumed"]
    if row["resume_rc"] != 0 or got is None:
        problems.append(f"the resumed job failed (rc {row['resume_rc']})")
    if done != [steps]:
        problems.append(f"the resumed job did not reach step {steps} ({done})")
    if row["sync_errors"]:
        problems.append(f"sync raised: {row['sync_errors'][:2]}")
    if framework not in NO_STEP and got != row["manifest_step"]:
        problems.append(f"resumed from {got}, the manifest says {row['manifest_step']}")
    restored = row["restored_step"]
    if framework not in NO_STEP and restored != row["manifest_step"]:
        problems.append(f"restored step {restored} is not the manifest's {row['manifest_step']}")
    if got not in [s for s, _ in saves]:
        problems.append(f"resumed from {got}, which the job never completely saved ({row['saved']})")
    newest = max((s for s, _ in saves), default=None)
    # the newest save the agent cannot take as torn: finished before a round's look at the live job
    safe = max((s for s, t in saves if t < looked), default=None)
    row["newest_saved"], row["newest_safe"] = newest, safe
    if framework in IN_PLACE:
        if got is not None and safe is not None and got < safe:
            problems.append(f"resumed from {got}, older than {safe}, which a round saw whole")
    elif got != newest:
        problems.append(f"resumed from {got}, not the newest complete save {newest}")
    row["result"] = "FAIL" if problems else "ok"


def render(rows: list[dict], env: dict[str, str]) -> str:
    header = [
        "framework",
        "signal",
        "files written (order of first sight)",
        "saved (newest)",
        "versions",
        "manifest step / layout",
        "resumed step",
        "result",
    ]
    body = []
    for r in rows:
        body.append(
            [
                r["framework"],
                r.get("signal", "-"),
                "<br>".join(r.get("names", [])),
                f"{len(r.get('saved', []))} ({r.get('newest_saved')})",
                str(r.get("versions", "-")),
                f"{r.get('manifest_step')} / {r.get('layout')}",
                str(r.get("resumed")),
                r["result"] + ("" if not r["problems"] else ": " + "; ".join(r["problems"])),
            ]
        )
    text = "versions: " + ", ".join(f"{k} {v}" for k, v in env.items()) + "\n\n" + table(header, body)
    text += "\n"
    for r in rows:
        text += (
            f"- {r['framework']}: units {r.get('units')}; restored {r.get('restored_files')}; "
            f"left out at the end {r.get('left_out')}; names new on resume {r.get('new_names')}; "
            f"newest save outside the torn window {r.get('newest_safe')}\n"
        )
    return text


def write(out: Path, work: Path, rows: list[dict], env: dict[str, str]) -> None:
    (out / "framework_table.md").write_text(render(rows, env))
    logs = "".join(
        f"==== {p.name}\n{p.read_text(errors='replace')[-20000:]}\n" for p in sorted(work.glob("*.log"))
    )
    (out / "framework_jobs.log").write_text(logs)
    (out / "framework_rows.json").write_text(json.dumps(rows, indent=1, default=str))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=",".join(FRAMEWORKS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.015)
    parser.add_argument("--budget-s", type=float, default=1e9, help="start no framework after this")
    parser.add_argument("--sigterm", default="", help="frameworks stopped with SIGTERM instead of SIGKILL")
    a = parser.parse_args()
    SIGNALS.update({name: signal.SIGTERM for name in a.sigterm.split(",") if name})
    reap_on_exit()
    out = Path(a.out or tempfile.mkdtemp(prefix="fwcheck-out-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fwcheck-"))
    rng = random.Random(a.seed)
    env = versions()
    print(f"seed {a.seed}; work {work}; {env}", flush=True)
    rows: list[dict] = []
    start = time.monotonic()
    for framework in a.only.split(","):
        began = time.monotonic()
        if began - start > a.budget_s:  # leave the rest of the run's time cap to the other checks
            rows.append({"framework": framework, "result": "SKIPPED", "problems": ["over --budget-s"]})
            continue
        try:
            row = check(framework, work, rng, a.steps, a.every, a.step_s)
        except Exception:
            row = {"framework": framework, "result": "FAIL", "problems": [traceback.format_exc(limit=3)]}
        row["seconds"] = round(time.monotonic() - began, 1)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        write(out, work, rows, env)  # after every framework: a time cap still leaves the table
    print(render(rows, env), flush=True)
    return 0 if all(r["result"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
