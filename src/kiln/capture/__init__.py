"""capture/: Python bytecode -> torch-level FX graph + guards + a residual program.

frontend.py   the compiled-callable object, its cache of entries, recompiles and limits
(more files land with the interpreter)
"""
