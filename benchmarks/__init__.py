"""Benchmarks: each prints its figures beside the machine's ceilings measured in the same run,
and writes JSON and a markdown table under benchmarks/results/."""
