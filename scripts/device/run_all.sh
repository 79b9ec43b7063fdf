#!/usr/bin/env bash
# The GPU-machine checks of issues 24 and 25 (not part of `make test`: CI has no GPU and none of these
# frameworks). Runs each part under its own time cap (about 300 s in all) and writes the tables and
# logs into $OUT (flat names, at most 8 files):
#   env.txt                machine, GPU, versions
#   framework_table.md     framework_checkpoints.py's table     framework_jobs.log, framework_rows.json
#   gang_table.md          torchrun_gang.py's table             gang_logs.txt
#   agent_gang_table.md    agent_gang.py's table                agent_gang_logs.txt
#   run_all.log            everything printed
# PARTS picks the parts (default "frameworks gang"; all three write 9 files, one more than the device
# tool brings back). agent_gang needs google-cloud-storage and gcp-storage-emulator importable
# (AGENT_SITE, a folder put ahead on its PYTHONPATH only, e.g. where the carried wheels were installed).
# Rerun:  PYTHONPATH=<repo> bash scripts/device/run_all.sh   (OUT defaults to ./device-out)
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
FRAMEWORK_CAP="${FRAMEWORK_CAP:-190}"
GANG_CAP="${GANG_CAP:-110}"
AGENT_GANG_CAP="${AGENT_GANG_CAP:-240}"
PARTS="${PARTS:-frameworks gang}"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
  date -u
  uname -a
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
  PYTHONPATH="${AGENT_SITE:+$AGENT_SITE:}${PYTHONPATH:-}" "$PY" - <<'EOF'
import sys
from importlib import metadata
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "lightning", "pytorch-lightning", "transformers", "accelerate", "safetensors",
             "jax", "jaxlib", "orbax-checkpoint", "numpy", "google-cloud-storage", "gcp-storage-emulator"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "-")
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
{
  for part in $PARTS; do
    case "$part" in
      frameworks)
        echo "== framework_checkpoints.py (cap ${FRAMEWORK_CAP}s)"
        timeout -k 10 "$FRAMEWORK_CAP" "$PY" "$HERE/framework_checkpoints.py" --out "$OUT" ${FRAMEWORK_ARGS:---budget-s 150}
        echo "framework_checkpoints rc $?" ;;
      gang)
        echo "== torchrun_gang.py (cap ${GANG_CAP}s)"
        timeout -k 10 "$GANG_CAP" "$PY" "$HERE/torchrun_gang.py" --out "$OUT" ${GANG_ARGS:-}
        echo "torchrun_gang rc $?" ;;
      agent_gang)
        echo "== agent_gang.py (cap ${AGENT_GANG_CAP}s)"
        PYTHONPATH="${AGENT_SITE:+$AGENT_SITE:}${PYTHONPATH:-}" \
          timeout -k 10 "$AGENT_GANG_CAP" "$PY" "$HERE/agent_gang.py" --out "$OUT" ${AGENT_GANG_ARGS:-}
        echo "agent_gang rc $?" ;;
      *) echo "unknown part $part" ;;
    esac
  done
} 2>&1 | tee "$OUT/run_all.log"
