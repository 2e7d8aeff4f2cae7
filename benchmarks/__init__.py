"""Scripts that reproduce a figure of README.md or benchmarks/RESULTS.md (benchmarks/README.md maps them); run each
from the repository root as `python -m benchmarks.<name>`."""
