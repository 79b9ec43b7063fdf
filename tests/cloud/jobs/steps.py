"""A small training loop for the checkpoint-resume tests: one step every STEP_S seconds, a checkpoint
every EVERY steps and on SIGTERM, resuming from the newest complete checkpoint it finds.

Usage: python3 steps.py STEPS EVERY STEP_S [FAIL_AT_STEP]

With ``STEPS_HOLD_AT=N`` in its environment, the first run (``CLOUDTRAIN_RESTARTS`` 0) stops counting
after step N until it is stopped (SIGTERM) or killed, or, with ``STEPS_HOLD_UNTIL=<path>``, until that
file exists: a test that acts on it mid-run then cannot lose the race to the job finishing first on a
slow machine; a relaunched job runs to the end. With ``STEPS_FINISH_AFTER=<path>``, every run holds
before its last step until that file exists: a test interrupting relaunched runs too cannot lose the
race to the job finishing first.
"""

import json
import os
import signal
import sys
import time

from airflow_cloudtrain import checkpoint

steps, every, step_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
fail_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
hold_at = int(os.environ.get("STEPS_HOLD_AT") or 0) if os.environ["CLOUDTRAIN_RESTARTS"] == "0" else 0
ckpt_dir = os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]
found = checkpoint.latest(ckpt_dir)
step = json.loads(found.read_text())["step"] if found else 0
print(
    f"resumed from step {step}" if found else "fresh start", f"restarts={os.environ['CLOUDTRAIN_RESTARTS']}"
)
print("started", flush=True)
stopping = False


def on_term(*_: object) -> None:
    global stopping
    stopping = True


def save(n: int) -> None:
    checkpoint.save(f"{ckpt_dir}/ckpt-{n:05d}.json", lambda tmp: tmp.write_text(json.dumps({"step": n})))


signal.signal(signal.SIGTERM, on_term)
while step < steps:
    time.sleep(step_s)
    step += 1
    print(f"step {step} at {time.time():.3f}", flush=True)
    if fail_at is not None and step == fail_at and os.environ["CLOUDTRAIN_RESTARTS"] == "0":
        print("failing on purpose", flush=True)
        sys.exit(3)
    if step % every == 0 or stopping:
        save(step)
    if step == hold_at:
        print(f"holding at step {step} until stopped", flush=True)
        release = os.environ.get("STEPS_HOLD_UNTIL")
        while not stopping and not (release and os.path.exists(release)):
            time.sleep(0.1)
    finish_after = os.environ.get("STEPS_FINISH_AFTER")
    if step == steps - 1 and finish_after:
        while not stopping and not os.path.exists(finish_after):
            time.sleep(0.1)
    if stopping:
        print(f"stopped at step {step} after SIGTERM", flush=True)
        sys.exit(143)
with open(os.path.join(os.environ["CLOUDTRAIN_OUTPUT_DIR"], "final.json"), "w") as out:
    json.dump({"step": step}, out)
print(f"done at step {step}", flush=True)
