"""`kiln bench` and `kiln demo`: the benchmark runner (models live in benchmarks/models)."""
