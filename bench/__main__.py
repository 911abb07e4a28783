"""`make bench`: runs every benchmark and prints its table."""

from __future__ import annotations

import sys


def main() -> int:
    print("no benchmarks yet: see issue 'Benchmarks and the chaos harness'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
