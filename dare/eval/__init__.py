"""Evaluation helpers: benchmarks and reports (to come), the trajectory viewer."""
