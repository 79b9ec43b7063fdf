"""The Vertex AI system test's module: a few seconds of work, one line per step (stdlib)."""

import time

for step in range(1, 4):
    time.sleep(0.5)
    print(f"step {step}/3", flush=True)
print("done", flush=True)
