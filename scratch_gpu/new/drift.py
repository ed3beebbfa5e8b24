"""Does eager get slower in a process after kiln compiles? (scratch, not committed)"""
import copy, gc, statistics, sys, time
import torch
sys.path.insert(0, "src")
from kiln.bench.suite import load_models

name, mode, comp = sys.argv[1], sys.argv[2], sys.argv[3]
models = load_models("benchmarks/models")
bm = models[name]
m_e, example = bm.factory("cuda", torch.bfloat16, "large", 0)
fresh = bm.inputs("cuda", torch.bfloat16, "large", 1)
m_c = copy.deepcopy(m_e)
ncoll = [0]
gc.callbacks.append(lambda phase, info: ncoll.__setitem__(0, ncoll[0] + (phase == "start")))

def lat(fn, n=150):
    cpu, l = [], []
    for _ in range(n):
        torch.cuda.synchronize(); t0 = time.perf_counter(); fn(*fresh); t1 = time.perf_counter()
        torch.cuda.synchronize(); cpu.append(t1 - t0); l.append(time.perf_counter() - t0)
    return f"cpu {statistics.median(cpu)*1e6:.0f} us, latency {statistics.median(l)*1e6:.0f} us"

def report(label, fn):
    c0 = ncoll[0]
    s = lat(fn)
    print(f"{label:28s} {s}  gc collections {ncoll[0]-c0}", flush=True)

with torch.no_grad():
    for _ in range(3): m_e(*fresh)
    report("eager, before", m_e)
    if comp == "kiln":
        import kiln
        c = kiln.compile(m_c, mode=mode)
    else:
        c = torch.compile(m_c, mode=mode)
    report("eager, after import", m_e)
    for _ in range(3): c(*example)
    report("eager, after compile", m_e)
    report(f"{comp}", c)
    report("eager, after compiled calls", m_e)
    gc.collect()
    report("eager, after gc.collect", m_e)
    print("gc counts", gc.get_count(), "objects", len(gc.get_objects()))
