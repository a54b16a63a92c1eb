"""Run `-m MODULE ARGS...` under cProfile and write the profile even when stopped by SIGTERM.

    python benchmarks/profiled.py OUT.prof -m cli.main serve --port 8000

uvicorn re-raises the signal that stopped it after restoring the handlers it found; the handler
installed here turns that into a normal exit, so cProfile gets to write its file. SIGUSR1 writes
every thread's stack to stderr (where is a stuck server?).
"""

from __future__ import annotations

import cProfile
import faulthandler
import runpy
import signal
import sys


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        print("usage: python benchmarks/profiled.py OUT.prof -m MODULE ARGS...\n\n" + __doc__.strip())
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    out, _, module, *rest = sys.argv[1:]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack
    sys.argv = [module, *rest]
    profiler = cProfile.Profile()
    try:
        profiler.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        profiler.dump_stats(out)


if __name__ == "__main__":
    main()
