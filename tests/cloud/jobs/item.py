"""One work item of the fleet tests: CLOUDTRAIN_WORK_ITEM is JSON ``{"steps", "step_s", "fail"}``.

Counts steps, checkpoints every other step and on SIGTERM, resumes from the newest complete
checkpoint, and writes ``item.json`` (the item, its id, the step it resumed from) to its output.
With ``"hold_at": N`` and ``"release": <path>``, a fresh start stops counting after step N until it is
stopped (SIGTERM) or that file exists: a test that interrupts a worker mid-item then cannot lose the
race to the item finishing first on a slow machine; a resumed item runs to the end.
"""

import json
import os
import signal
import sys
import time

from airflow_cloudtrain import checkpoint

item = json.loads(os.environ["CLOUDTRAIN_WORK_ITEM"])
item_id = os.environ["CLOUDTRAIN_ITEM_ID"]
ckpt_dir = os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]
found = checkpoint.latest(ckpt_dir)
step = resumed = json.loads(found.read_text())["step"] if found else 0
print(f"item {item_id}: " + (f"resumed from step {step}" if found else "fresh start"), flush=True)
if item.get("fail"):
    print(f"item {item_id} fails on purpose", flush=True)
    sys.exit(3)
stopping = False


def on_term(*_: object) -> None:
    global stopping
    stopping = True


def save(n: int) -> None:
    checkpoint.save(f"{ckpt_dir}/ckpt-{n:05d}.json", lambda tmp: tmp.write_text(json.dumps({"step": n})))


signal.signal(signal.SIGTERM, on_term)
while step < item["steps"]:
    time.sleep(item.get("step_s", 0.1))
    step += 1
    print(f"item {item_id} step {step}", flush=True)
    if step % 2 == 0 or stopping:
        save(step)
    if not found and step == item.get("hold_at"):
        print(f"item {item_id} holding at step {step}", flush=True)
        while not stopping and not os.path.exists(item["release"]):
            time.sleep(0.1)
    if stopping:
        sys.exit(143)
with open(os.path.join(os.environ["CLOUDTRAIN_OUTPUT_DIR"], "item.json"), "w") as out:
    json.dump({"id": item_id, "item": item, "resumed_from": resumed, "step": step}, out)
print(f"item {item_id} done", flush=True)
