"""waveboost's benchmark suite: `python -m waveboost.bench --help`.

cli.py (the command line), grid.py (cells and presets), impls.py (one adapter per
implementation), measure.py (check, memory and timing of one cell), report.py (CSV, JSON,
Markdown and the console table) and charts.py (PNGs). `import waveboost` does not import it.
"""

from .cli import main

__all__ = ["main"]
