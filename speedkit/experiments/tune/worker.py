"""One extra worker process of a search: ``python -m speedkit.experiments.tune.worker CONFIG_JSON INDEX``.

``tune(TuneSettings(n_workers=N))`` starts N-1 of these; each works on the same Optuna study
(through its storage) until the search's phases close, then exits.
"""
from __future__ import annotations

import signal
import sys
import threading

from speedkit.experiments.tune.search import TuneConfig, run_phases


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m speedkit.experiments.tune.worker CONFIG_JSON WORKER_INDEX", file=sys.stderr)
        return 2
    stop = threading.Event()
    # Ctrl-C in the terminal reaches every worker: each stops at its next batch, like the main process
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    config = TuneConfig.load(argv[0])
    config.rebuild_task()  # a folder task or a user's task is built here as the first process built it
    run_phases(config, worker_index=int(argv[1]), should_stop=stop.is_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
