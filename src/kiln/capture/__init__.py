"""capture/: Python bytecode -> torch-level FX graph + guards + a residual program.

In: a function, bound method or nn.Module and its call arguments. Out: the call's result
(traced by running kiln's interpreter on the real values), and for later calls a cache entry:
a generated Python function that checks guards, runs the backend's compiled graph, replays side
effects and rebuilds outputs; at a graph break it calls a continuation.

frontend.py         the compiled callable: cache of entries, tracing on a miss, limits
interpreter.py      frames, the run loop, exception dispatch, interpreted generators
bytecode.py         every CPython-version difference; opcode handler registry
ops_basic.py        handlers: stack, locals, cells, globals, attributes, operators, subscripts
ops_build.py        handlers: tuples, lists, sets, dicts, strings, unpacking
ops_call.py         handlers: calls, keyword names, function creation, intrinsics, imports
ops_control.py      handlers: jumps, loops, return/yield, exceptions, with
ops_classes.py      handlers: class statements (__build_class__, the body's name lookups)
ops_match.py        handlers: match statements' pattern tests
ops_except_star.py  handlers: `except*` (exception groups)
calls.py            how a call runs: inline, native (recorded), or a graph break
attributes.py       attribute loads/stores with sources, guards and replayed stores
module_calls.py     nn.Module calls: hooks + forward
builtin_specials.py getattr/hasattr/setattr/delattr/print/len/iter/id/sys.exc_info, kiln's way
tracer.py           the recording side: FX graph, placeholders, guards, TorchFunctionMode
torch_calls.py      what a torch call is (graph op, metadata, data read) and its FX node
sources.py          where a value came from, as guard/residual code
guards.py           guard kinds, their code, and the recompile explanation
containers.py       guards on outside containers' contents (subclasses, object keys) and lookups
module_tree.py      a version number of watched modules' structure (one guard for all params)
side_effects.py     stores into outside objects and prints, to replay
effect_calls.py     logging, warnings, lru_cache helpers: replayed or answered, no break
context_vars.py     contextvars get/set/reset: run for real, shadowed, net effect replayed
environ.py          os.environ: each variable read guarded, writes are graph breaks
optimizers.py       a traced optimizer's step counts on its parameters' device (capturable)
residual.py         rebuilding values; the generated entry function
continuations.py    graph breaks: frame-chain snapshots, continuations' frames, resuming
breaks.py           what happens at a break: graph so far, the step, the continuation
symbolic.py         SymInt/SymFloat: numbers that are graph values and guard by use
dynamic.py          dynamic shapes: fake tensors with symbolic sizes, shape guards
explain.py          kiln.explain and the `kiln explain` command
capture_cache.py    a frame's trace kept for later processes: saved, found again, refused why
recipes.py          outside objects named so that another process finds the same ones
graph_data.py       a captured FX graph as plain data and back
process_order.py    what a trace computed that holds in its own process only (id, set order)
errors.py           Unsupported (user-facing) and kiln's internal signals
"""

# The opcode handlers register with bytecode.opcode when imported; the interpreter finds them
# there (it imports none of them, so no handler module imports it back in a cycle).
from . import (  # noqa: E402,F401
    ops_basic,
    ops_build,
    ops_call,
    ops_classes,
    ops_control,
    ops_except_star,
    ops_match,
)
from .bytecode import UNSUPPORTED as _UNSUPPORTED  # noqa: E402
from .bytecode import handler as _handler  # noqa: E402

assert _UNSUPPORTED or _handler("LOAD_FAST") is not None  # none register on an unknown Python
