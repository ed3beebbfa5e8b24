import torch, triton, triton.language as tl

@triton.jit
def colsum3(extern9, arg111, arg112, arg113, buf25, buf26, buf23, buf34, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    rbase = tl.arange(0, RBLOCK)[None, :]
    acc1 = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)
    for roffset in range(0, 8192, RBLOCK):
        rindex = roffset + rbase
        tmp2 = tl.load(extern9 + (768*rindex + xindex))
        tmp3 = tl.load(arg111 + (768*rindex + xindex))
        tmp4 = tl.load(arg112 + (rindex))
        tmp7 = ((tmp3 - tmp4) * tl.load(arg113 + (rindex)))
        acc1 = acc1 + tl.broadcast_to(tmp2 * tmp7, [XBLOCK, RBLOCK])
    tl.store(buf25 + (xindex), tl.sum(acc1, 1, keep_dims=True))
    acc11 = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)
    for roffset in range(0, 8192, RBLOCK):
        rindex = roffset + rbase
        acc11 = acc11 + tl.load(extern9 + (768*rindex + xindex))
    tl.store(buf26 + (xindex), tl.sum(acc11, 1, keep_dims=True))
    acc15 = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)
    for roffset in range(0, 8192, RBLOCK):
        rindex = roffset + rbase
        acc15 = acc15 + tl.load(buf23 + (768*rindex + xindex))
    tl.store(buf34 + (xindex), tl.sum(acc15, 1, keep_dims=True))

g, x, b = (torch.randn(8192, 768, device="cuda") for _ in range(3))
mean, rstd = torch.randn(8192, device="cuda"), torch.rand(8192, device="cuda")
o1, o2, o3 = (torch.empty(768, device="cuda") for _ in range(3))
def t(fn):
    for _ in range(3): fn()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    best = 1e9
    for _ in range(5):
        s.record()
        for _ in range(20): fn()
        e.record(); e.synchronize(); best = min(best, s.elapsed_time(e) / 20 * 1e3)
    return best
for xb, rb, nw in ((32,128,4),(32,128,8),(16,128,4),(16,64,4),(8,128,4),(8,256,4),(8,256,8),(8,64,2),(4,256,4),(16,256,8)):
    us = t(lambda: colsum3[(768 // xb,)](g, x, mean, rstd, o1, o2, b, o3, XBLOCK=xb, RBLOCK=rb, num_warps=nw))
    ok = torch.allclose(o2, g.sum(0), atol=1e-2) and torch.allclose(o3, b.sum(0), atol=1e-2)
    print(f"XBLOCK={xb} RBLOCK={rb} warps={nw}: {us:.1f} us ({75.5e6/us/1e3:.0f} GB/s) ok={ok}", flush=True)
print("torch sums (3 separate):", t(lambda: (g.sum(0), b.sum(0), (g * (x - mean[:, None]) * rstd[:, None]).sum(0))))
