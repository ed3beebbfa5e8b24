import sys, time, warnings, statistics, torch
sys.path.insert(0, "src"); sys.path.insert(0, "benchmarks")
from gpu_compare import model, best_ms, call_us
import kiln
name = sys.argv[1]
m, inputs = model(name)
with torch.no_grad():
    c = kiln.compile(m)
    for _ in range(3): c(*inputs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c(*inputs)
    torch.cuda.set_sync_debug_mode(0)
    print("sync warnings:", len(w))
    for x in w[:5]: print("  ", str(x.message)[:300])
    import traceback
    print("best_ms", best_ms(c, inputs), "call_us (cpu, latency)", call_us(c, inputs))
    tc = torch.compile(m)
    for _ in range(3): tc(*inputs)
    print("torch best_ms", best_ms(tc, inputs), "call_us", call_us(tc, inputs))
