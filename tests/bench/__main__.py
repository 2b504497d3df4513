"""Run the benchmarks: ``python -m tests.bench [NAME ...]``.

Each ``tests/bench/bench_NAME.py`` defines ``main() -> None`` that measures our code
and a baseline in the same run and prints one line per figure with the ratio. No
figure here is an assertion: these machines are noisy.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(
        m.name.removeprefix("bench_")
        for m in pkgutil.iter_modules([str(here)])
        if m.name.startswith("bench_")
    )
    wanted = argv or names
    unknown = [n for n in wanted if n not in names]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(names)}")
        return 2
    for name in wanted:
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        module = importlib.import_module(f"tests.bench.bench_{name}")
        module.main()
        print(f"   ({time.perf_counter() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
