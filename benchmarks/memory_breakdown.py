"""Where a training step's or an inference call's memory goes: eager, kiln and torch.compile.

Takes command-line options (models, compilers, device); prints one table row per (model,
compiler) with, for one step after warm-up:

- saved: bytes of the distinct storages saved for the backward, parameters and inputs left out,
  read off the autograd graph the forward built (`saved_graph_tensors`: every node's `_saved_*`
  tensors, and a compiled graph's `saved_tensors`), so any compiler's forward is seen the same
  way; `--top N` lists the N largest (shape, dtype, and the node or, for kiln, the ATen op
  that made them);
- fw peak / step peak: the most bytes alive at once, of tensors created during the forward
  (resp. the whole step: forward, loss, backward), above what was alive before it. On the CPU
  counted by `LiveBytes`, a dispatch mode that sees every tensor an ATen op or a wrapper's
  `empty_strided` makes and drops it when its storage dies; on CUDA
  `torch.cuda.max_memory_allocated` above the memory allocated before. torch.compile runs a frame
  eagerly under a Python dispatch mode (and its generated code allocates below the dispatcher),
  so its `LiveBytes` cells are left empty;
- rss peak (CPU): the process's peak resident memory during the step above its resident memory
  before it (`VmHWM`, reset through `/proc/self/clear_refs`; the child process runs with glibc's
  mmap threshold fixed, so every large tensor is its own mapping, returned when freed), plus
  the arena blocks kiln holds between calls (allocated before the step). It sees every compiler
  alike, torch.compile's generated code included;
- kept: bytes allocated during the first call (the compile) that stay alive after it, on the
  CPU: constants a compiler made (folded weights, copies of parameters), arenas, caches;
- arena: bytes kiln's arena blocks hold between calls (CPU; `kiln.runtime.arenas.held_bytes`),
  memory the step peak above does not see because it is allocated at the first call.

`--step` measures a whole training step instead (forward with the loss, backward, AdamW's
`opt.step`, `zero_grad(set_to_none=True)`; model and `opt.step` both compiled, as
benchmarks/train_steps.py runs them) on the first step (the compile: kiln's trace runs the step
for real) and on a steady one: for each phase, the most bytes alive during it above what was
alive when the step began, and the bytes alive at its end (on the CPU, plus the arena blocks kiln
holds between calls, which were allocated before the step; on CUDA, `max_memory_allocated`
reset at each phase's start). Rows `step 1` (the first) and `step N` (the last of `--steps`).

Models: `gpt2` (Hugging Face GPT2LMHeadModel from a config, `labels=` so the cross-entropy is
computed inside the model, as the issue's training row; on the CPU 2 layers, d768, 2 x 512
tokens, GPT-2's vocabulary of 50257: real proportions, the logits by far the largest tensor),
`nanogpt` (the suite's nanoGPT, loss
`F.cross_entropy` in the compiled function), and `resnet` (a ResNet-50-shaped bottleneck conv net
written in plain torch, inference under `no_grad`, channels-last). CPU sizes are small; `--device
cuda` uses the issue's sizes (GPT-2: 6 layers, d768, batch 8 x 512; ResNet: batch 32, 224 x 224,
bfloat16) and adds torch.compile by default.

`--amp` runs the forward under `torch.autocast(device, torch.bfloat16)`.

Usage: PYTHONPATH=src python3 benchmarks/memory_breakdown.py [--models gpt2,nanogpt,resnet]
       [--compilers eager,kiln,torch] [--device cpu|cuda] [--amp] [--top N]
       [--step [--steps N]]
Each compiler runs in its own process (`--one MODEL COMPILER` is that process).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from kiln.bench.live_bytes import LiveBytes

MIB = 2**20


def _real(t) -> bool:
    """A tensor with memory of its own: not a meta or fake one (a compiler's tracing)."""
    return (
        isinstance(t, torch.Tensor)
        and t.device.type != "meta"
        and not isinstance(t, FakeTensor)
        and type(t) in (torch.Tensor, nn.Parameter)
    )


def saved_graph_tensors(out, exclude: set[int]) -> list[tuple[int, str, tuple, str]]:
    """The distinct storages the autograd graph behind `out` saved for the backward, those whose
    data pointer is in `exclude` (parameters, inputs) left out: (bytes, what saved it, shape,
    dtype), largest first. Read off the graph, not through saved-tensor hooks, so a compiler
    that runs its forward in generated code (torch.compile) is seen as eager is: each node's
    `_saved_*` tensors (eager), a compiled graph's `saved_tensors` (kiln, torch.compile)."""
    found: dict[int, tuple[int, str, tuple, str]] = {}
    todo = [t.grad_fn for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    seen: set = set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for what, t in _node_saved(node):
            storage = t.untyped_storage()
            if storage.data_ptr() in exclude or storage.nbytes() == 0:
                continue
            found.setdefault(
                storage.data_ptr(),
                (storage.nbytes(), what, tuple(t.shape), str(t.dtype).removeprefix("torch.")),
            )
        todo.extend(f for f, _ in node.next_functions)
    return sorted(found.values(), key=lambda r: -r[0])


def _node_saved(node) -> list[tuple[str, torch.Tensor]]:
    name = type(node).__name__
    got: list[tuple[str, torch.Tensor]] = []
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:  # freed already, or not a tensor
            continue
        values = value if isinstance(value, (tuple, list)) else [value]
        got += [(f"{name}.{attr[7:]}", v) for v in values if isinstance(v, torch.Tensor)]
    if hasattr(node, "saved_tensors"):  # a custom autograd.Function: a compiled graph
        ops = _kiln_saved_ops(node)
        for k, t in enumerate(node.saved_tensors):
            got.append((f"{name}[{k}]" + (f" {ops[k]}" if ops else ""), t))
    return got


def _kiln_saved_ops(node) -> list[str]:
    """For a kiln graph's node: the ATen op that made each saved value (from the partition
    record of kiln's entry with the same saved values), else []."""
    if "kiln" not in sys.modules or not hasattr(node, "plan"):
        return []
    from kiln.autograd.compile import AotCompiled

    shapes = [tuple(t.shape) for t in node.saved_tensors]
    for c in (o for o in gc.get_objects() if isinstance(o, AotCompiled)):
        for part in c.partitions.values():
            nodes = {n.name: n for n in part.fw.graph.nodes}
            made = [nodes[name] for name in part.saved]
            vals = [n.meta.get("val") for n in made]
            if [tuple(getattr(v, "shape", ())) for v in vals] == shapes:
                return [f"{n.name}={n.target}" for n in made]
    return []


def saved_bytes(run, exclude: set[int]) -> tuple[object, int, list]:
    """(what `run()` returned, bytes of distinct storages saved for the backward, the largest
    of them) — see `saved_graph_tensors`."""
    out = run()
    rows = saved_graph_tensors(out, exclude)
    return out, sum(r[0] for r in rows), rows


class RssPeak:
    """The process's peak resident bytes while the block runs, above its resident bytes when it
    began (Linux: `VmHWM` reset through `/proc/self/clear_refs`)."""

    def __enter__(self):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.base = _status("VmRSS")
        return self

    def __exit__(self, *exc):
        self.peak = _status("VmHWM") - self.base


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


# ---- models ----------------------------------------------------------------------------------


def _gpt2(device: str, large: bool):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    layers, d, heads, batch, seq = (6, 768, 12, 8, 512) if large else (2, 768, 12, 2, 512)
    cfg = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=max(seq, 256))
    cfg.loss_type = "ForCausalLM"
    model = GPT2LMHeadModel(cfg).to(device).train()
    model.config.use_cache = False

    def batch_of(gen):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
        return {"input_ids": ids, "labels": ids}

    return model, batch_of, lambda m, b: m(**b).loss


def _nanogpt(device: str, large: bool):
    sys.path.insert(0, os.path.dirname(__file__))
    from models.nanogpt import GPT, GPTConfig

    cfg = GPTConfig(1024, 50304, 6, 12, 768) if large else GPTConfig(256, 50304, 2, 4, 128, True)
    batch, seq = (8, 512) if large else (2, 128)
    model = GPT(cfg).to(device).train()

    def batch_of(gen):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=gen).to(device)
        return {"idx": ids[:, :-1].contiguous(), "targets": ids[:, 1:].contiguous()}

    def loss(m, b):
        logits = m(b["idx"])
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), b["targets"].view(-1))

    return model, batch_of, loss


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        cout = mid * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet50Shape(nn.Module):
    """torchvision's ResNet-50 layout (stem, 3-4-6-3 bottlenecks, widths 64-512) in plain torch,
    at `width` times its channels."""

    def __init__(self, width: float = 1.0, blocks=(3, 4, 6, 3), classes: int = 1000):
        super().__init__()
        c = int(64 * width)
        self.stem = nn.Sequential(
            nn.Conv2d(3, c, 7, 2, 3, bias=False),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        layers, cin = [], c
        for i, n in enumerate(blocks):
            mid = int(64 * width) * 2**i
            for j in range(n):
                layers.append(Bottleneck(cin, mid, 2 if j == 0 and i > 0 else 1))
                cin = mid * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _resnet(device: str, large: bool):
    dtype = torch.bfloat16 if large else torch.float32
    width, batch, hw = (1.0, 32, 224) if large else (0.25, 4, 96)
    model = ResNet50Shape(width).to(device, dtype).eval().to(memory_format=torch.channels_last)

    def batch_of(gen):
        x = torch.randn(batch, 3, hw, hw, generator=gen).to(device, dtype)
        return {"x": x.to(memory_format=torch.channels_last)}

    return model, batch_of, None  # inference


MODELS = {"gpt2": _gpt2, "nanogpt": _nanogpt, "resnet": _resnet}


# ---- one measurement -------------------------------------------------------------------------


def _compiled(compiler: str, model):
    if compiler == "kiln":
        import kiln

        return kiln.compile(model)
    if compiler == "torch":
        return torch.compile(model)
    return model


def _autocast(loss_of, device: str, amp: bool):
    """`loss_of` run under bf16 autocast when `amp`."""
    if loss_of is None or not amp:
        return loss_of

    def run(m, b):
        with torch.autocast(device, torch.bfloat16):
            return loss_of(m, b)

    return run


def measure(
    model_name: str, compiler: str, device: str, large: bool, amp: bool = False, top: int = 0
) -> dict:
    warmup = 2
    torch.manual_seed(0)
    model, batch_of, loss_of = MODELS[model_name](device, large)
    loss_of = _autocast(loss_of, device, amp)
    fn = _compiled(compiler, model)
    gen = torch.Generator().manual_seed(1)
    batches = [batch_of(gen) for _ in range(warmup + 1)]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    params |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    cuda = device == "cuda"

    def forward(b):
        if loss_of is None:
            with torch.no_grad():
                return fn(**b)
        return loss_of(fn, b)

    def step(b):
        out = forward(b)
        if loss_of is not None:
            out.backward()
        return out

    row = {"model": model_name, "compiler": compiler, "device": device, "amp": amp}
    # torch.compile runs a frame eagerly while a Python dispatch mode is active (as LiveBytes
    # is), so its first call (the compile) runs outside one, and on the CPU its peaks cannot be
    # counted this way at all: those cells stay empty rather than report eager's bytes.
    counted = not cuda and compiler != "torch"
    if counted:
        with LiveBytes(_real) as first:
            step(batches[0])
    else:
        step(batches[0])
    model.zero_grad(set_to_none=True)
    gc.collect()
    row["kept"] = first.now if counted else None
    for b in batches[1:warmup]:
        step(b)
        model.zero_grad(set_to_none=True)
    b = batches[warmup]
    exclude = params | {t.untyped_storage().data_ptr() for t in b.values()}
    if loss_of is not None:
        out, row["saved"], largest = saved_bytes(lambda: forward(b), exclude)
        row["largest_saved"] = largest[:top]
        out.backward()
        del out
        model.zero_grad(set_to_none=True)
    if not cuda:
        with RssPeak() as rss:
            del_out = step(b)
            del del_out
        row["rss_peak"] = rss.peak + _arena_bytes()
    for phase, run in (("fw_peak", lambda: forward(b)), ("step_peak", lambda: step(b))):
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = run()
            torch.cuda.synchronize()
            row[phase] = torch.cuda.max_memory_allocated() - base
        elif counted:
            with LiveBytes(_real) as live:
                out = run()
            row[phase] = live.peak
        else:
            out, row[phase] = run(), None
        del out
    if compiler == "kiln" and not cuda:
        from kiln.runtime.arenas import held_bytes

        row["arena"] = held_bytes()
    if cuda:
        row["cuda_total_peak"] = torch.cuda.max_memory_allocated()
    return row


PHASES = ("forward", "backward", "opt_step", "zero_grad")


class _Counter:
    """Bytes alive above a step's start and the most since a phase began: `LiveBytes` on the
    CPU (plus what kiln's arenas hold, allocated before the step and invisible to the mode),
    the CUDA allocator's statistics on CUDA."""

    def __init__(self, cuda: bool, counted: bool) -> None:
        self.cuda, self.counted = cuda, counted
        self.live = LiveBytes(_real) if counted and not cuda else None

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = -_arena_bytes()  # held arenas count as in use by the step
            if self.live is not None:
                self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.__exit__(*exc)

    def phase_start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        elif self.live is not None:
            self.live.peak = self.live.now

    def phase_end(self) -> tuple[int | None, int | None]:
        """(the phase's peak, bytes alive at its end), both above the step's start."""
        if self.cuda:
            torch.cuda.synchronize()
            return (
                torch.cuda.max_memory_allocated() - self.base,
                torch.cuda.memory_allocated() - self.base,
            )
        if self.live is None:
            return None, None
        return self.live.peak - self.base, self.live.now - self.base


def _arena_bytes() -> int:
    if "kiln" not in sys.modules:
        return 0
    from kiln.runtime.arenas import held_bytes

    return held_bytes()


def measure_step(
    model_name: str, compiler: str, device: str, large: bool, steps: int, amp: bool = False
) -> dict:
    """The training step's memory by phase, on the first step and on step `steps` (module doc)."""
    torch.manual_seed(0)
    model, batch_of, loss_of = MODELS[model_name](device, large)
    loss_of = _autocast(loss_of, device, amp)
    if loss_of is None:
        raise SystemExit(f"--step needs a training model; {model_name} is inference only")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fn, opt_step = _compiled(compiler, model), _compiled(compiler, opt.step)
    gen = torch.Generator().manual_seed(1)
    batches = [batch_of(gen) for _ in range(min(steps, 4))]
    cuda = device == "cuda"
    row: dict = {"model": model_name, "compiler": compiler, "device": device, "step": True}
    for i in range(steps):
        b = batches[i % len(batches)]
        gc.collect()
        # torch.compile runs a frame eagerly under a Python dispatch mode (module doc): counted
        # on CUDA only, and its first call outside any mode
        counted = cuda or compiler != "torch"
        record = i in (0, steps - 1)
        phases = {}
        with _Counter(cuda, counted and record) as count:
            count.phase_start()
            loss = loss_of(fn, b)
            phases["forward"] = count.phase_end()
            count.phase_start()
            loss.backward()
            phases["backward"] = count.phase_end()
            count.phase_start()
            opt_step()
            phases["opt_step"] = count.phase_end()
            count.phase_start()
            opt.zero_grad(set_to_none=True)
            phases["zero_grad"] = count.phase_end()
            row["loss" if i else "first_loss"] = float(loss)
            del loss
        if record:
            row["first" if i == 0 else "steady"] = phases
    row["steps"] = steps
    if compiler == "kiln" and not cuda:
        row["arena"] = _arena_bytes()
    if cuda:
        row["cuda_total_peak"] = torch.cuda.max_memory_allocated()
    return row


def _step_table(rows: list[dict]) -> None:
    head = " | ".join(f"{p} peak | {p} end" for p in PHASES)
    print(f"| model | compiler | step | {head} | step peak |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in range(2 * len(PHASES))) + " | --- |")
    for r in rows:
        for which, label in (("first", "1"), ("steady", str(r["steps"]))):
            phases = r[which]
            cells = [_fmt(v) for p in PHASES for v in phases[p]]
            peaks = [phases[p][0] for p in PHASES if phases[p][0] is not None]
            cells.append(_fmt(max(peaks)) if peaks else "-")
            print(f"| {r['model']} | {r['compiler']} | {label} | " + " | ".join(cells) + " |")


def _fmt(v) -> str:
    return "-" if v is None else f"{v / MIB:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,nanogpt,resnet")
    ap.add_argument("--compilers", default=None, help="default eager,kiln (cuda: eager,torch,kiln)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--large", action="store_true", help="the issue's sizes (default on cuda)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--step", action="store_true", help="a whole training step, by phase")
    ap.add_argument("--steps", type=int, default=3, help="with --step: the steady step's number")
    ap.add_argument("--amp", action="store_true", help="forward under bf16 autocast")
    ap.add_argument("--top", type=int, default=0, help="list the N largest saved tensors")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "COMPILER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    large = args.large or args.device == "cuda"
    if args.one:
        if args.step:
            print(json.dumps(measure_step(*args.one, args.device, large, args.steps, args.amp)))
        else:
            print(json.dumps(measure(*args.one, args.device, large, args.amp, args.top)))
        return 0
    compilers = args.compilers or ("eager,torch,kiln" if args.device == "cuda" else "eager,kiln")
    rows = []
    for model_name in args.models.split(","):
        for compiler in compilers.split(","):
            cmd = [sys.executable, __file__, "--device", args.device, "--one", model_name, compiler]
            cmd += ["--large"] if large else []
            cmd += ["--step", "--steps", str(args.steps)] if args.step else []
            cmd += ["--amp"] if args.amp else []
            cmd += ["--top", str(args.top)]
            # every large tensor its own mapping, returned to the system when freed (no heap
            # growth that outlives it, no moving threshold): what the RSS peak needs
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                print(f"{model_name} {compiler}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(lines[-1]))
    amp = ", bf16 autocast" if args.amp else ""
    print(f"device {args.device}, {'issue sizes' if large else 'small sizes'}{amp}; MiB")
    if args.step:
        _step_table(rows)
    else:
        _table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _table(rows: list[dict]) -> None:
    keys = ("saved", "fw_peak", "step_peak", "rss_peak", "kept", "arena")
    print(
        "| model | compiler | saved | fw peak | step peak | rss peak (CPU) | kept (CPU) "
        "| arena (CPU) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        cells = [r.get(k) for k in keys]
        print(f"| {r['model']} | {r['compiler']} | " + " | ".join(_fmt(c) for c in cells) + " |")
    for r in rows:
        if r.get("largest_saved"):
            print(f"\nlargest saved, {r['model']} {r['compiler']}:")
            for nbytes, what, shape, dtype in r["largest_saved"]:
                print(f"  {nbytes / MIB:8.1f} MiB  {dtype:9s} {list(shape)}  {what}")


if __name__ == "__main__":
    sys.exit(main())
