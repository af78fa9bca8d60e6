"""Print the algorithm x family matrix: ``python -m dare.algos`` (the README's table is this output)."""

from . import matrix

print(matrix(), end="")
