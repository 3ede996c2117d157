"""`python -m probe` and the `probe` command: the CLI, quiet at a Ctrl-C even while it imports
(exit 130, as when a run is interrupted)."""

import signal
import sys

EXIT_INTERRUPTED = 130


def run() -> int:
    # A Ctrl-C while the CLI imports is noted, not raised: raised inside the import machinery
    # (a module lock's callback), Python prints it as an ignored exception, traceback and all.
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _: caught.append(signum))
    try:
        from probe.present.cli import main
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(run())
