import sys, warnings, traceback, torch
sys.path.insert(0, "src")
import kiln
from kiln.bench.suite import load_models
bm = load_models("benchmarks/models")["nanogpt"]
m, ex = bm.factory("cuda", torch.float32, "large", 0)
m.train()
c = kiln.compile(m)
def step():
    for p in m.parameters(): p.grad = None
    out = c(*ex); out.float().sum().backward()
for _ in range(2): step()
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    step()
torch.cuda.set_sync_debug_mode(0)
print("syncs:", len(w))
for x in w[:6]:
    print(" -", str(x.message)[:200], x.filename, x.lineno)
# where: rerun with error mode to get a traceback
torch.cuda.set_sync_debug_mode("error")
try:
    step()
except Exception:
    traceback.print_exc(limit=-8)
torch.cuda.set_sync_debug_mode(0)
x = torch.randint(0, 50304, (8, 1024), device="cuda"); g = torch.randn(8, 1024, 768, device="cuda")
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as w2:
    warnings.simplefilter("always")
    torch.ops.aten.embedding_dense_backward(g, x, 50304, -1, False)
    z = torch.zeros(50304, 768, device="cuda"); z.index_put_((x.view(-1),), g.view(-1, 768), accumulate=True)
    z2 = torch.zeros(50304, 768, device="cuda"); z2.index_add_(0, x.view(-1), g.view(-1, 768))
print("embedding_dense_backward / index_put_ / index_add_ syncs:", [str(a.message)[:80] for a in w2])
