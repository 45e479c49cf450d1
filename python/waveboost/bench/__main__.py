"""`python -m waveboost.bench`; the `waveboost-bench` script calls `main` from here too."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
