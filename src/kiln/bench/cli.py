"""Command-line entry points for `kiln demo` and `kiln bench` (placeholder demo until the
benchmark runner lands): the demo compiles an MLP, checks it against eager, times both."""

from __future__ import annotations

import time

import torch


def _median_ms(fn, x, reps: int = 30) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def demo_main(argv: list[str]) -> int:
    import kiln

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024),
        torch.nn.Linear(1024, 256),
    ).eval()
    x = torch.randn(64, 256)
    t0 = time.perf_counter()
    compiled = kiln.compile(model)
    with torch.no_grad():
        out = compiled(x)
        compile_s = time.perf_counter() - t0
        ref = model(x)
        torch.testing.assert_close(out, ref)
        x2 = torch.randn(64, 256)
        torch.testing.assert_close(compiled(x2), model(x2))
        eager_ms = _median_ms(model, x)
        kiln_ms = _median_ms(compiled, x)
    print(f"model: MLP 256-1024-256 with GELU+LayerNorm, batch 64, {torch.__version__}")
    print(f"first call (capture + compile): {compile_s * 1e3:.1f} ms; output matches eager")
    print(f"eager {eager_ms:.3f} ms, kiln {kiln_ms:.3f} ms, speedup {eager_ms / kiln_ms:.2f}x")
    return 0


def bench_main(argv: list[str]) -> int:
    print("kiln bench: the benchmark runner has not landed yet (issue 8)")
    return 2
