"""The pass of :mod:`.bounds` in C, compiled on first use with the system C compiler (ctypes).

Why: the numpy pass does a few dozen array operations per tick; at 15-second ticks (17,280 per
72 h run) their overhead and temporaries dominate, and the held-out scale (about 7,000 runs over
9 zones) takes hours. The same recurrences in a C loop over (run, price, tick, zone) take a minute.
It is the very same program, state for state and tie for tie (``tests/unit/test_policy_bounds.py``
checks both against each other); where no compiler is found (or ``CLOUDTRAIN_BOUNDS_NUMPY=1``),
:mod:`.bounds` uses numpy. The library is cached under the user's cache folder, keyed by the
source's hash, so it is compiled once per machine. Nothing here runs at import.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#define TOL 1e-9
typedef struct { double v, c, w, bill; } St;
static const St NONE = {INFINITY, 0.0, 0.0, INFINITY};
static inline void better(St *a, const St *b) { if (b->v < a->v) *a = *b; }
static inline St add(St s, double price, double hours, double work, double usd, double lam, double job) {
    St o;
    o.v = s.v + (price * hours + usd) - lam * work;
    o.c = s.c + (price * hours + usd);
    o.w = s.w + work;
    o.bill = (s.w < job - TOL && o.w >= job - TOL) ? o.c - price * (o.w - job) : s.bill;
    return o;
}
int lagrange_pass(int Z, int B, int L, int T, int64_t W, const uint8_t *avail, const int32_t *runlen,
                  const int64_t *rows, const int64_t *starts, const int32_t *region, int nreg,
                  const double *lam, double job, double gap, double ps, double po,
                  const double *setup, const int32_t *len, double egress,
                  double *out_value, double *out_bill) {
    int ring = len[0];
    for (int i = 1; i < 3; i++) if (len[i] > ring) ring = len[i];
    ring += 1;
    int same_region_moves = Z > nreg;
    St *mem = malloc(sizeof(St) * (size_t)Z * (5 + 2 * (size_t)ring) + sizeof(St) * (size_t)nreg);
    if (!mem) return -1;
    St *idle = mem, *spot = mem + Z, *od = mem + 2 * Z, *src = mem + 3 * Z, *tmp = mem + 4 * Z;
    St *arr_s = mem + 5 * Z, *arr_o = arr_s + (size_t)ring * Z, *preg = arr_o + (size_t)ring * Z;
    for (int b = 0; b < B; b++) {
        for (int l = 0; l < L; l++) {
            double lm = lam[(size_t)b * L + l];
            for (int z = 0; z < Z; z++) {
                St zero = {0.0, 0.0, 0.0, INFINITY};
                idle[z] = zero; spot[z] = NONE; od[z] = NONE;
            }
            for (int i = 0; i < ring * Z; i++) { arr_s[i] = NONE; arr_o[i] = NONE; }
            for (int k = 0; k <= T; k++) {
                int slot = k % ring;
                for (int z = 0; z < Z; z++) {
                    better(&spot[z], &arr_s[slot * Z + z]); better(&od[z], &arr_o[slot * Z + z]);
                    arr_s[slot * Z + z] = NONE; arr_o[slot * Z + z] = NONE;
                }
                if (k == T) break;
                int64_t pos = starts[b] + k;
                for (int z = 0; z < Z; z++) {
                    if (!avail[rows[(size_t)z * B + b] * W + pos]) { better(&idle[z], &spot[z]); spot[z] = NONE; }
                }
                for (int r = 0; r < nreg; r++) preg[r] = NONE;
                for (int z = 0; z < Z; z++) {
                    src[z] = idle[z]; better(&src[z], &od[z]);
                    better(&preg[region[z]], &src[z]);
                }
                for (int z = 0; z < Z; z++) {
                    int32_t rl = runlen[rows[(size_t)z * B + b] * W + pos];
                    if (rl >= len[0]) {
                        St c = add(src[z], ps, len[0] * gap, len[0] * gap - setup[0], 0.0, lm, job);
                        better(&arr_s[((k + len[0]) % ring) * Z + z], &c);
                    }
                    if (same_region_moves && rl >= len[1]) {
                        St c = add(preg[region[z]], ps, len[1] * gap, len[1] * gap - setup[1], 0.0, lm, job);
                        better(&arr_s[((k + len[1]) % ring) * Z + z], &c);
                    }
                    if (nreg > 1 && rl >= len[2]) {
                        St best = NONE;
                        for (int r = 0; r < nreg; r++) if (r != region[z]) better(&best, &preg[r]);
                        St c = add(best, ps, len[2] * gap, len[2] * gap - setup[2], egress, lm, job);
                        better(&arr_s[((k + len[2]) % ring) * Z + z], &c);
                    }
                }
                for (int z = 0; z < Z; z++) {
                    St s = idle[z]; better(&s, &spot[z]);
                    St c = add(s, po, len[0] * gap, len[0] * gap - setup[0], 0.0, lm, job);
                    better(&arr_o[((k + len[0]) % ring) * Z + z], &c);
                    tmp[z] = idle[z]; better(&tmp[z], &spot[z]); better(&tmp[z], &od[z]);
                }
                for (int z = 0; z < Z; z++) {
                    idle[z] = tmp[z];
                    spot[z] = add(spot[z], ps, gap, gap, 0.0, lm, job);
                    od[z] = add(od[z], po, gap, gap, 0.0, lm, job);
                }
            }
            St best = NONE;
            for (int z = 0; z < Z; z++) { better(&best, &idle[z]); better(&best, &spot[z]); better(&best, &od[z]); }
            out_value[(size_t)b * L + l] = best.v;
            out_bill[(size_t)b * L + l] = best.w >= job - TOL ? best.bill : INFINITY;
        }
    }
    free(mem);
    return 0;
}
"""

_LIB: Any = None
_TRIED = False


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "airflow_cloudtrain"


def library() -> Any:
    """The compiled pass (a ctypes function), or ``None`` without a C compiler or when disabled."""
    global _LIB, _TRIED
    if os.environ.get("CLOUDTRAIN_BOUNDS_NUMPY") == "1":
        return None
    if _TRIED:
        return _LIB
    _TRIED = True
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    try:
        folder = _cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir())
    target = folder / f"bounds_{digest}.so"
    if not target.exists():
        with tempfile.TemporaryDirectory() as tmp:
            c_file, so_file = Path(tmp) / "bounds.c", Path(tmp) / "bounds.so"
            c_file.write_text(SOURCE)
            cmd = [compiler, "-O2", "-shared", "-fPIC", "-o", str(so_file), str(c_file), "-lm"]
            if subprocess.run(cmd, capture_output=True, timeout=120, check=False).returncode != 0:
                return None
            os.replace(so_file, target)  # atomic: a parallel worker sees the old or the whole file
    lib = ctypes.CDLL(str(target))
    fn = lib.lagrange_pass
    fn.restype = ctypes.c_int
    _LIB = fn
    return fn


def run_pass(program: Any, lam: Any) -> tuple[Any, Any] | None:
    """The C pass for a :class:`.bounds._Program`; ``None`` where no compiler is available."""
    fn = library()
    if fn is None:
        return None
    np_ = program.np
    runs, prices = lam.shape
    avail = np_.ascontiguousarray(program.avail, dtype=np_.uint8)
    runlen = np_.ascontiguousarray(program.runlen, dtype=np_.int32)
    rows = np_.ascontiguousarray(program.rows, dtype=np_.int64)
    starts = np_.ascontiguousarray(program.starts, dtype=np_.int64)
    region = np_.ascontiguousarray(program.region_of, dtype=np_.int32)
    lam_c = np_.ascontiguousarray(lam, dtype=np_.float64)
    setup = np_.asarray(program.setups, dtype=np_.float64)
    lengths = np_.asarray(program.lengths, dtype=np_.int32)
    value, bill = np_.empty((runs, prices)), np_.empty((runs, prices))

    def ptr(a: Any) -> Any:
        return ctypes.c_void_p(a.ctypes.data)

    rc = fn(
        ctypes.c_int(rows.shape[0]),
        ctypes.c_int(runs),
        ctypes.c_int(prices),
        ctypes.c_int(program.ticks),
        ctypes.c_int64(avail.shape[1]),
        ptr(avail),
        ptr(runlen),
        ptr(rows),
        ptr(starts),
        ptr(region),
        ctypes.c_int(program.n_regions),
        ptr(lam_c),
        ctypes.c_double(program.job),
        ctypes.c_double(program.gap),
        ctypes.c_double(program.ps),
        ctypes.c_double(program.po),
        ptr(setup),
        ptr(lengths),
        ctypes.c_double(program.egress),
        ptr(value),
        ptr(bill),
    )
    if rc != 0:
        raise MemoryError("bounds: the C pass could not allocate its states")
    return value, bill
