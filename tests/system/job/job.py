"""The system tests' job: a few seconds of "training" that writes one checkpoint and one result (stdlib)."""

import json
import os
import time

steps = int(os.environ.get("SYSTEM_STEPS", "3"))
for step in range(1, steps + 1):
    time.sleep(0.5)
    print(f"step {step}/{steps}", flush=True)
ckpt = os.environ.get("CLOUDTRAIN_CHECKPOINT_DIR")
if ckpt:
    os.makedirs(ckpt, exist_ok=True)
    with open(os.path.join(ckpt, f"ckpt-{steps}.json.tmp"), "w") as out:
        json.dump({"step": steps}, out)
    os.replace(os.path.join(ckpt, f"ckpt-{steps}.json.tmp"), os.path.join(ckpt, f"ckpt-{steps}.json"))
out_dir = os.environ.get("CLOUDTRAIN_OUTPUT_DIR") or "."
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, "result.json"), "w") as out:
    json.dump({"steps": steps, "item": os.environ.get("CLOUDTRAIN_ITEM_ID")}, out)
print("done", flush=True)
