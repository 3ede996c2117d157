"""`python -m probe` and the `probe` command: the CLI, quiet at a Ctrl-C even while it imports
(exit 130, as when a run is interrupted)."""

import sys

EXIT_INTERRUPTED = 130


def run() -> int:
    try:
        from probe.present.cli import main

        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(run())
