"""Compiled optimizer steps with their state on the parameters' device (capture/optimizers.py).

On an accelerator, kiln steps an optimizer as `capturable=True` with its step counts on the
parameters' device, as torch.compile does: the step is then a few kernels with no host-side ATen
call. The CPU tests run that same capturable step (C++, and Triton under its interpreter) and
compare it with torch's capturable step run eagerly on the code path torch takes under a compiler,
step after step, with a learning rate a scheduler changes every step; the GPU tests check that a
default optimizer over CUDA parameters is made capturable, runs without ATen calls in a constant
number of launches, and matches plain eager.
"""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch

import kiln
from kiln import logs
from kiln.backends.builtin import inductor
from kiln.contracts import CaptureInfo
from kiln.options import build_options

OPTIMIZERS = {
    "adam": lambda ps, **kw: torch.optim.Adam(ps, lr=0.05, **kw),
    "adamw": lambda ps, **kw: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, **kw),
    "adamw_amsgrad": lambda ps, **kw: torch.optim.AdamW(ps, lr=0.05, amsgrad=True, **kw),
    "sgd": lambda ps, **kw: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, **kw),
}
TRITON = {"codegen.device": "cuda"}  # Triton kernels; on CPU tensors, under its interpreter


def _shapes(n: int) -> list[tuple[int, ...]]:
    """`n` parameter shapes of distinct sizes: matrices and vectors."""
    return [(3 + i, 2 + 2 * i) if i % 2 else (5 + 7 * i,) for i in range(n)]


def _logged(fn) -> str:
    """The output_code + perf_hints log of `fn()`."""
    with logs.captured("output_code", "perf_hints") as buf:
        fn()
    return buf.getvalue()


def _launches(code: str) -> int:
    """Kernel calls in the last wrapper of the log: C++ `kernel3(...)`, Triton `kernel3[(4,)](`."""
    wrapper = code.split("wrapper:")[-1].split("\n\n")[0]
    return len(re.findall(r"^\s+kernel\d+(?:\[|\()", wrapper, re.M))


def _run(name, n, foreach, options, device="cpu", steps=4, capturable=True, shapes=None):
    """`steps` compiled steps against eager's over `n` parameters (of `shapes`, else
    `_shapes(n)`), a scheduler changing the lr each step; gives (the compile log, the number of
    graphs compiled)."""
    g = torch.Generator().manual_seed(n)
    shapes = shapes if shapes is not None else _shapes(n)
    ref = [torch.randn(s, generator=g).to(device).requires_grad_() for s in shapes]
    got = [p.detach().clone().requires_grad_() for p in ref]
    kw = {"foreach": foreach}
    if capturable and name != "sgd":  # (SGD keeps no step count: it has no such flag)
        kw["capturable"] = True
    ref_opt, opt = OPTIMIZERS[name](ref, **kw), OPTIMIZERS[name](got, **kw)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.7)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    graphs = []
    # (a backend callable gets no options: kiln's backend is given them as kiln.compile would)
    info = CaptureInfo(options=build_options(options=options))

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inductor(gm, example_inputs, info)

    step = kiln.compile(opt.step, backend=counting, fullgraph=True)
    code = ""
    for _ in range(steps):
        for a, b in zip(ref, got):
            a.grad = torch.randn(a.shape, generator=g).to(device)
            b.grad = a.grad.clone()
        with mock.patch("torch.compiler.is_compiling", return_value=capturable):
            ref_opt.step()  # (capturable on the CPU: the path torch takes under a compiler)
        code += _logged(step)
        ref_sched.step()
        sched.step()
        for a, b in zip(ref, got):
            torch.testing.assert_close(b, a)
            for k, v in ref_opt.state[a].items():
                # (on a GPU kiln's step counts are on the device, eager's on the CPU)
                torch.testing.assert_close(
                    opt.state[b][k], v, check_device=False, msg=lambda m, k=k: f"{k}: {m}"
                )
    return code, len(graphs)


@pytest.mark.parametrize("options", [None, TRITON], ids=["cpp", "triton"])
@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_capturable_step_matches_eager_in_few_launches(name, foreach, options):
    """The step kiln runs on a GPU (capturable, counts on the device): eager's values step after
    step, no ATen call left in the wrapper, no recompile when the lr changes; a foreach step is
    at most 2 launches for 12 parameters of 12 sizes as for 4, single-tensor steps too (their
    counts' increments make one kernel of one-value members, schedule/fusion.py, ahead of the
    per-parameter updates, which group as a foreach step's do)."""
    if options is TRITON:
        from kiln.runtime.triton_interpret import is_interpreting

        if not is_interpreting():
            pytest.skip("Triton interpreter is off (a GPU run)")
    launches = {}
    for n in (4, 12):
        code, graphs = _run(name, n, foreach, options)
        assert graphs <= 3, graphs  # state creation, the first step, steady steps (lr dynamic)
        wrapper = code.split("wrapper:")[-1]
        assert "aten_" not in wrapper and "extern call" not in code, code[-3000:]
        launches[n] = _launches(code)
    assert launches[4] == launches[12] <= 2, launches


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.mark.gpu
@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("name", ["adam", "adamw", "adamw_amsgrad"])
def test_cuda_step_keeps_its_counts_on_the_device(name, foreach):
    """A default (not capturable) optimizer over CUDA parameters: kiln makes it capturable with
    its step counts on the GPU, so no ATen call (a CPU op on a step count, or a per-parameter
    update reading one) is left in the wrapper, and the values stay plain eager's."""
    _cuda()
    launches = {}
    for n in (4, 12):
        code, graphs = _run(name, n, foreach, None, device="cuda", capturable=False)
        assert graphs <= 3, graphs
        wrapper = code.split("wrapper:")[-1]
        assert "aten_" not in wrapper and "extern call" not in code, code[-3000:]
        launches[n] = _launches(code)
    assert launches[4] == launches[12] <= 2, launches


@pytest.mark.gpu
def test_cuda_optimizer_is_made_capturable_with_counts_on_the_device():
    _cuda()
    params = [torch.randn(5, 3, device="cuda", requires_grad=True) for _ in range(3)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, foreach=True)
    opt.step()  # eager: the state exists, counts on the CPU
    assert opt.state[params[0]]["step"].device.type == "cpu"
    kiln.compile(opt.step)()
    assert opt.param_groups[0]["capturable"] is True
    assert all(opt.state[p]["step"].device == p.device for p in params)


def test_cpu_optimizer_keeps_its_counts_on_the_cpu():
    """On the CPU the step counts are where kernels run already: the optimizer is left alone."""
    params = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, foreach=True)
    kiln.compile(opt.step)()
    kiln.compile(opt.step)()
    assert opt.param_groups[0]["capturable"] is False
    assert all(opt.state[p]["step"].device.type == "cpu" for p in params)


def test_cuda_graph_of_a_step_reads_a_scheduled_lr_in_its_kernels():
    """The Triton code of a CUDA step, made on this machine from the graph kiln captures (on the
    CPU) given fake CUDA tensors: a learning rate a scheduler changes is a float input, which
    lives on the GPU beside the parameters (autograd/float_inputs.py). On the CPU, `1 - lr * wd`
    was a host-side ATen call, and so was each parameter's weight decay that read it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    params = [torch.randn(s).requires_grad_() for s in _shapes(6)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=True, capturable=True)
    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    step = kiln.compile(opt.step, backend=grab)
    for _ in range(3):  # the state, then two learning rates: the lr is a float input
        step()
        opt.param_groups[0]["lr"] *= 0.5
    gm, example_inputs = graphs[-1]
    assert any(type(x) is float for x in example_inputs)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fake = [
            torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda")
            if isinstance(x, torch.Tensor)
            else x
            for x in example_inputs
        ]
        # (the Triton build for a CUDA device this machine lacks fails after the code is
        # logged, and the backend runs the graph on eager kernels: only the code is checked)
        code = _logged(lambda: inductor(gm, fake))
    assert "Triton kernels:" in code
    assert "extern call" not in code, code[-3000:]
    assert _launches(code) <= 4


def _kernels(code: str) -> dict[str, str]:
    """The Triton kernels of the last graph compiled in the log: name -> source."""
    text = code.split("Triton kernels:")[-1].split("wrapper:")[0]
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r"def (\w+)\(.*?(?=@triton\.jit|\Z)", text, re.S)
    }


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_step_reads_and_writes_each_tensor_once(name, foreach):
    """Each parameter's update reads its parameter, gradient and state once and writes them
    once, as torch's fused kernels do: no kernel reads, element by element, a tensor another
    kernel of the step wrote (only one-value buffers, the bias corrections computed once from
    the step counts, pass between kernels). The step counts' one-value updates used to join a
    larger kernel as per-row members, after the kernels computing the moments: each parameter's
    update then read its moments back in a second kernel (9 tensor passes where 7 do)."""
    from kiln.runtime.triton_interpret import is_interpreting

    if not is_interpreting():
        pytest.skip("Triton interpreter is off (a GPU run)")
    # parameters large enough that the bias corrections are stored once, not recomputed per
    # element (schedule/realize.py BROADCAST_RECOMPUTE_MIN), and small ones
    shapes = [(70, 65), (5000,), (33,), (64, 80), (7, 3), (4500,)]
    code, _ = _run(name, len(shapes), foreach, TRITON, shapes=shapes)
    kernels = _kernels(code)
    assert kernels
    stored = {k: set(re.findall(r"tl\.store\((\w+) \+", src)) for k, src in kernels.items()}
    for k, src in kernels.items():
        elementwise = {
            buf for buf, index in re.findall(r"tl\.load\((\w+) \+ \(([^)]*)\)", src) if index != "0"
        }
        for other, wrote in stored.items():
            assert other == k or not (elementwise & wrote), (k, other, elementwise & wrote)


@pytest.mark.parametrize("foreach", [True, False])
def test_steady_step_allocates_nothing(foreach):
    """The one-value intermediates of a step (bias corrections and step sizes, stored once per
    parameter rather than recomputed per element) live in a block the Triton wrapper keeps
    between calls (schedule/arena.py `plan_small_arena`): a steady step's wrapper allocates
    nothing, where it made one `empty_strided` call for each of them; the values stay eager's."""
    from kiln.codegen.triton import load
    from kiln.runtime.triton_interpret import is_interpreting

    if not is_interpreting():
        pytest.skip("Triton interpreter is off (a GPU run)")
    shapes = [(70, 65), (5000,), (33,), (64, 80), (4500,)]
    g = torch.Generator().manual_seed(5)
    ref = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    got = [p.detach().clone().requires_grad_() for p in ref]
    kw = {"lr": 0.05, "weight_decay": 0.1, "foreach": foreach, "capturable": True}
    ref_opt, opt = torch.optim.AdamW(ref, **kw), torch.optim.AdamW(got, **kw)
    counts = []
    real_empty = load._empty

    def counted(*args):  # (the wrapper's allocations; Triton's interpreter makes its own)
        counts[-1] += 1
        return real_empty(*args)

    with mock.patch.object(load, "_empty", counted):
        step = kiln.compile(opt.step, options=TRITON)
        for _ in range(4):
            for a, b in zip(ref, got):
                a.grad = torch.randn(a.shape, generator=g)
                b.grad = a.grad.clone()
            with mock.patch("torch.compiler.is_compiling", return_value=True):
                ref_opt.step()
            counts.append(0)
            step()
            for a, b in zip(ref, got):
                torch.testing.assert_close(b, a)
                for k, v in ref_opt.state[a].items():
                    torch.testing.assert_close(opt.state[b][k], v, msg=lambda m, k=k: f"{k}: {m}")
    assert counts[-1] == 0, counts


def _params(code: str) -> dict[str, int]:
    """Each Triton kernel of the last graph in the log: its number of arguments (constexprs
    included), as the launch passes them."""
    text = code.split("Triton kernels:")[-1].split("wrapper:")[0]
    return {
        name: len(args.split(","))
        for name, args in re.findall(r"def (kernel\d+)\((.*?)\):", text, re.S)
    }


def _gpt2_small_shapes() -> list[tuple[int, ...]]:
    """GPT2LMHeadModel(GPT2Config()).parameters() shapes (lm_head is tied to wte): 148."""
    d, vocab, pos = 768, 50257, 1024
    shapes: list[tuple[int, ...]] = [(vocab, d), (pos, d)]
    for _ in range(12):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,)]  # ln_1, attn
        shapes += [(d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]  # ln_2, mlp
    return shapes + [(d,), (d,)]  # ln_f


def _gpt2_small_adamw_code() -> str:
    """The output_code log of GPT-2 small's AdamW step (its 148 parameter shapes, fake CUDA
    tensors, as test_cuda_graph_of_a_step_reads_a_scheduled_lr_in_its_kernels makes it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        params = [torch.empty(s, device="cuda").requires_grad_() for s in _gpt2_small_shapes()]
        for p in params:
            p.grad = torch.empty_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True, capturable=True)
    for p in params:  # the state a first step makes, on the parameters' (fake) device
        with mode:
            opt.state[p] = {
                "step": torch.zeros((), device="cuda"),
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
            }
    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    with mode:
        kiln.compile(opt.step, backend=grab)()
        gm, example_inputs = graphs[-1]
        return _logged(lambda: inductor(gm, list(example_inputs)))


def _parts(src: str) -> list[str]:
    """A Triton kernel's horizontal parts (the branches on its program id), or the kernel."""
    return re.split(r"\n    if (?:\(gpid >= \d+\) & \()?gpid < \d+\)?:", src)[1:] or [src]


def test_gpt2_small_adamw_step_kernels_stay_within_the_argument_cap():
    """GPT-2 small's AdamW step on the GPU: no kernel takes more buffer arguments than the
    device's horizontal cap (schedule/wide.py), so none reaches the native launch's 512 and
    none is a straight-line kernel Triton takes long to build. Fused by size, the 74 vectors of
    768 made one kernel of 594 arguments on one program (37 s to build for sm_90), and the
    counts and bias corrections one of 398."""
    from kiln.devices.builtin import CUDA
    from kiln.runtime.triton_native_launcher import MAX_PARAMS

    cap = CUDA.capabilities.horizontal
    code = _gpt2_small_adamw_code()
    params_of = _params(code)
    assert len(params_of) >= 4, code[-3000:]
    assert max(params_of.values()) <= cap + 1 < MAX_PARAMS, params_of  # (+1: XBLOCK)
    assert "extern call" not in code, code[-3000:]


def test_gpt2_small_adamw_step_is_few_launches_of_one_tensor_a_program():
    """The shape of GPT-2 small's AdamW step on the GPU (148 tensors, 124.4 M elements): every
    program of a tensor kernel updates one block of one tensor (horizontal parts: a program
    walking twelve tensors moved 344 KB, and a launch of such programs ended in a long last
    wave), the bias corrections 1 - beta ** step are computed by those programs from the step
    count (schedule/realize.py; three launches of one-value members computed them before), and
    each in-place tensor is one kernel argument (codegen/triton/module.py), so the step is at
    most 8 launches, was 14. The one launch of one-value members left adds 1 to step counts
    that later launches read: a program of a tensor's update cannot store its count's new value
    while other programs may still read the old one."""
    code = _gpt2_small_adamw_code()
    kernels = {k: src for k, src in _kernels(code).items() if k.startswith("kernel")}
    assert _launches(code) <= 8, _launches(code)
    one_value = []
    for name, src in kernels.items():
        parts = _parts(src)
        if all(re.search(r"xnumel(_p\d+)? = 1\n", p) for p in parts):
            one_value.append(name)
        for part in parts:
            stores = re.findall(r"tl\.store\((\w+) \+ \(([^)]*)\)", part)
            elementwise = [buf for buf, index in stores if "xindex" in index and "0*" not in index]
            assert len(elementwise) <= 3, (name, elementwise)  # p, exp_avg, exp_avg_sq
    assert len(one_value) <= 1, one_value
    for name in one_value:  # the counts' increments, and nothing else
        assert "pow" not in kernels[name] and "sqrt" not in kernels[name], kernels[name][:3000]


@pytest.mark.parametrize("options", [None, TRITON], ids=["cpp", "triton"])
def test_many_tensors_of_one_size_split_into_parts(options):
    """Foreach AdamW over 48 vectors of one size and 6 matrices of another: fused by size, the
    vectors made one kernel of more buffers than the device's cap (schedule/wide.py); split,
    each tensor's update is a part of a horizontal kernel. Eager's values step after step, and
    every kernel within the cap."""
    from kiln.devices.builtin import CPU, CUDA

    if options is TRITON:
        from kiln.runtime.triton_interpret import is_interpreting

        if not is_interpreting():
            pytest.skip("Triton interpreter is off (a GPU run)")
    shapes = [(37,)] * 48 + [(9, 70)] * 6
    code, _ = _run("adamw", len(shapes), True, options, steps=3, shapes=shapes)
    if options is TRITON:
        cap = CUDA.capabilities.horizontal
        assert max(_params(code).values()) <= cap + 1, _params(code)
    else:
        cap = CPU.capabilities.horizontal
        wrapper = code.split("wrapper:")[-1]
        calls = re.findall(r"^\s+kernel\d+\(.*$", wrapper, re.M)
        assert calls, wrapper
        # (a C++ kernel's buffers are passed as `.data_ptr()`, its sizes as integers)
        widest = max(call.count(".data_ptr()") for call in calls)
        assert widest <= cap, widest


def _most_live_blocks(src: str) -> int:
    """The most block values (a kernel's `tmpN` computed from an element-wise load, directly
    or through another block value) live at once in a Triton kernel's straight-line source:
    a value is live from the line that binds it to the last line that reads it. (A proxy for
    the registers a thread needs: one-value loads and constants do not count.)"""
    lines = src.split("\n")
    block: set[str] = set()
    born: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        m = re.match(r"\s+(tmp\d+) = (.*)$", line)
        used = set(re.findall(r"\btmp\d+\b", m.group(2) if m else line))
        for t in used:
            last[t] = i
        if m and ("xindex" in m.group(2) or used & block):
            block.add(m.group(1))
            born[m.group(1)] = i
    return max(
        (sum(born[t] < i <= last.get(t, born[t]) for t in block) for i in range(len(lines))),
        default=0,
    )


def test_tensors_of_one_size_in_one_kernel_are_updated_one_after_another():
    """A foreach step over tensors of one size is one kernel (fusion.py's same-size
    candidates); in graph order it computed every tensor's first moment, then every second
    moment, then every update, holding each tensor's values across all the others' (GPT-2's
    twelve 768 x 3072 tensors: 255 registers and spills a thread on sm_90). Its members now come
    a tensor at a time (schedule/wide.py), so the values live at once do not grow with the
    number of tensors; the results stay eager's."""
    from kiln.runtime.triton_interpret import is_interpreting

    if not is_interpreting():
        pytest.skip("Triton interpreter is off (a GPU run)")
    live = {}
    for n in (2, 8):
        code, _ = _run("adamw", n, True, TRITON, steps=2, shapes=[(64, 80)] * n)
        kernels = _kernels(code)
        # the kernel of the tensors' updates: the one of element-wise loads
        widest = max(kernels.values(), key=lambda s: s.count("(xindex"))
        assert widest.count("tl.store") >= 3 * n, widest  # (one kernel for the n tensors)
        live[n] = _most_live_blocks(widest)
    assert live[8] <= live[2], live
