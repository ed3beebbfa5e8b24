"""bench/: `kiln bench` and `kiln demo`, the benchmark runner (DESIGN.md §5).

In: command-line choices and the model suite in the repository's `benchmarks/models/`.
Out: result rows (correctness vs eager, cold compile time, steady-state time, peak memory,
graphs and breaks, and fallbacks: graphs that ran on eager kernels because kiln gave up on
them, which mark a correct row `yes*`) on the terminal and as JSON, Markdown and a PNG chart.

cli.py      argument parsing, suite presets applied, the run loop, `kiln demo`
suite.py    presets (`--suite cpu|gpu`), loading benchmarks/models by path, the task list
worker.py   one task in a fresh process with empty compiler caches (runner and worker sides)
measure.py  inside a worker: compile, check against eager, time, take peak memory
report.py   the live table and progress bar; JSON, Markdown and PNG writers
"""
