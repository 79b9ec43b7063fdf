"""Write pytest's assertion-rewritten bytecode for the test modules once, before the suite's workers start.

pytest caches the test modules it rewrites for its assertion messages (``__pycache__/*-pytest-*.pyc``),
but ``make test``'s six xdist workers start their collection at once and each would parse and rewrite
all ~200 test modules before any had written the cache (and where ``PYTHONDONTWRITEBYTECODE`` is set,
as on this machine and CI's outside ``make``, none ever writes it): about 5 of a worker's 12
CPU-seconds of collection, 30 CPU-seconds a suite. pytest reads such a cache even when it may not write
one, and the cache is keyed by the source's hash, so a file changed since is simply rewritten again.
Best effort: this only saves
time, and does nothing when pytest's private rewriting functions moved (a newer pytest).
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


class _State:
    @staticmethod
    def trace(message: str) -> None:  # what pytest's AssertionState.trace is asked on a failed write
        pass


def main() -> int:
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            get_cache_dir,
            try_makedirs,
        )
    except ImportError:
        return 0
    written = 0
    for path in sorted(TESTS.rglob("*.py")):
        if not (path.name == "conftest.py" or path.name.startswith("test_")):
            continue  # what pytest rewrites here: test modules (``python_files``) and conftest files
        cache_dir = get_cache_dir(path)
        pyc = cache_dir / (path.name[:-3] + PYC_TAIL)
        if _read_pyc(path, pyc) is not None or not try_makedirs(cache_dir):
            continue
        # config None: no ``enable_assertion_pass_hook``, as this project's pytest settings have it
        source_hash, code = _rewrite_test(path, None)  # type: ignore[arg-type]
        written += _write_pyc(_State(), code, source_hash, pyc)  # type: ignore[arg-type]
    if "-v" in sys.argv:
        print(f"rewrote {written} test modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
