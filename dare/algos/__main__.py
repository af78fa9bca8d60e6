"""``python -m dare.algos``: the algorithm x family matrix (the README's table is this output), then what each
algorithm is; ``python -m dare.algos NAME``: one algorithm's card (paper, knobs, recipes, commands);
``python -m dare.algos --pages docs/algorithms``: writes each algorithm's documentation page there."""

import sys
from pathlib import Path

from . import matrix
from .catalogue import card, catalogue, write_pages

if len(sys.argv) > 2 and sys.argv[1] == "--pages":
    print(f"wrote {len(write_pages(Path(sys.argv[2])))} pages to {sys.argv[2]}")
elif len(sys.argv) > 1:
    try:
        print(card(sys.argv[1]), end="")
    except ValueError as e:
        sys.exit(f"error: {e}")
else:
    print(matrix() + "\n" + catalogue(), end="")
