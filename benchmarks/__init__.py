"""Benchmarks, baselines and probes of xlnet-lite; run each from the repository root as `python -m benchmarks.<name>`."""
