"""`python -m probe`: the same as the `probe` command."""

from probe.cli import main

if __name__ == "__main__":
    main()
