#!/usr/bin/env bash
# The GPU-machine checks of issues 24 and 25 (not part of `make test`: CI has no GPU and none of these
# frameworks). Runs each part under its own time cap (about 300 s in all) and writes the tables and
# logs into $OUT (flat names, at most 8 files):
#   env.txt                machine, GPU, versions
#   framework_table.md     framework_checkpoints.py's table     framework_jobs.log, framework_rows.json
#   gang_table.md          torchrun_gang.py's table             gang_logs.txt
#   run_all.log            everything printed
# Rerun:  PYTHONPATH=<repo> bash scripts/device/run_all.sh   (OUT defaults to ./device-out)
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
FRAMEWORK_CAP="${FRAMEWORK_CAP:-190}"
GANG_CAP="${GANG_CAP:-110}"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
  date -u
  uname -a
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
  "$PY" - <<'EOF'
import sys
from importlib import metadata
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "lightning", "pytorch-lightning", "transformers", "accelerate", "safetensors",
             "jax", "jaxlib", "orbax-checkpoint", "numpy"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "-")
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
{
  echo "== framework_checkpoints.py (cap ${FRAMEWORK_CAP}s)"
  timeout -k 10 "$FRAMEWORK_CAP" "$PY" "$HERE/framework_checkpoints.py" --out "$OUT" ${FRAMEWORK_ARGS:---budget-s 150}
  echo "framework_checkpoints rc $?"
  echo "== torchrun_gang.py (cap ${GANG_CAP}s)"
  timeout -k 10 "$GANG_CAP" "$PY" "$HERE/torchrun_gang.py" --out "$OUT" ${GANG_ARGS:-}
  echo "torchrun_gang rc $?"
} 2>&1 | tee "$OUT/run_all.log"
