"""``python -m dare.algos``: the algorithm x family matrix (the README's table is this output), then what each
algorithm is; ``python -m dare.algos NAME``: one algorithm's card (paper, knobs, recipes, commands)."""

import sys

from . import matrix
from .catalogue import card, catalogue

if len(sys.argv) > 1:
    try:
        print(card(sys.argv[1]), end="")
    except ValueError as e:
        sys.exit(f"error: {e}")
else:
    print(matrix() + "\n" + catalogue(), end="")
