"""A warm process's Triton kernels straight from Triton's cache (runtime/triton_cached.py): no
kernel module imported, no `JITFunction` built, Triton's binder never asked (so
`triton.experimental` is never imported), and any launch the record does not vouch for goes
through Triton as before.

On the CPU machine: the loader over a stand-in Triton cache folder (real `CompiledKernel`s read
from files of the layout Triton writes, with a stand-in binary), what it refuses, and which
launches a cached kernel serves. Marked `gpu`: two real processes over one kiln cache and one
Triton cache, the warm one launching every kernel of a training step without importing any
kernel module, its results against eager on fresh data."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kiln.runtime import triton_cached

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

PLAN_A = ([torch.float32, torch.float32, 4096], (16,), {"XBLOCK": 256}, 4)
PLAN_B = ([torch.bfloat16, torch.float32], (8,), {"XBLOCK": 128, "RBLOCK": 64}, 8)
SIG = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"}
SIG_B = {"in_ptr0": "*bf16", "out_ptr0": "*fp32", "XBLOCK": "constexpr", "RBLOCK": "constexpr"}
H0, H1, H3, H4 = (hashlib.sha256(bytes([i])).hexdigest() for i in (0, 1, 3, 4))
SOURCE = "import triton\n\n@triton.jit\ndef k0(a): pass\n\nk2 = k0  # the same code as k0\n"


def _spec(name: str, signature: dict) -> str:
    return json.dumps({"name": name, "signature": signature, "options": {}})


def _folder(root, kernel_hash: str):
    """Where Triton's file cache keeps a hash's files: under the hash in base 32."""
    return root / base64.b32encode(bytes.fromhex(kernel_hash)).decode().rstrip("=")


def _write_group(root, kernel_hash: str, name: str, **meta) -> None:
    """A kernel as Triton's file cache keeps it: metadata JSON, binary, and the group file."""
    folder = _folder(root, kernel_hash)
    folder.mkdir(parents=True)
    metadata = {
        "name": name,
        "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
        "num_warps": 4,
        "num_ctas": 1,
        "shared": 0,
        "global_scratch_size": 0,
        "profile_scratch_size": 0,
        **meta,
    }
    (folder / f"{name}.json").write_text(json.dumps(metadata))
    (folder / f"{name}.cubin").write_bytes(os.urandom(64))
    (folder / f"{name}.ptx").write_text("// the PTX, for reading")
    group = {f"{name}.{ext}": str(folder / f"{name}.{ext}") for ext in ("json", "cubin", "ptx")}
    (folder / f"__grp__{name}.json").write_text(json.dumps({"child_paths": group}))


@pytest.fixture
def triton_cache(tmp_path, monkeypatch):
    """A Triton cache holding k0 and k1, with kiln's native launch reported present; gives the
    record kiln keeps of them and a list of the module imports asked for."""
    root = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(root))
    from kiln.runtime import triton_native_launcher

    monkeypatch.setattr(triton_native_launcher, "_native_launch", lambda: lambda *a: None)
    _write_group(root, H0, "k0")
    _write_group(root, H1, "k1")
    known = {
        "k0": triton_cached.record_of(_spec("k0", SIG), H0, PLAN_A),
        "k1": triton_cached.record_of(_spec("k1", SIG_B), H1, PLAN_B),
    }
    return root, known


def test_a_recorded_module_loads_without_importing_it(triton_cache):
    root, known = triton_cache
    imports = []
    module = triton_cached.load(
        SOURCE, {"k0": PLAN_A, "k1": PLAN_B}, known, lambda: imports.append(1) or _Real()
    )
    assert module is not None and imports == []
    k0, k1 = module.k0, module.k1
    assert isinstance(k0, triton_cached.CachedKernel) and k0.compiled.hash == H0
    assert set(k0.compiled.asm) == {"cubin"}  # the IR texts beside it are not read
    assert k1.compiled.metadata.name == "k1" and k1.compiled.src.signature == SIG_B
    assert module.k2 is k0  # an alias of the same code is the same kernel
    assert imports == []
    # anything else (a looped twin the plan left out) imports the module when first used, once
    k9, k8 = module.k9, module.k8
    assert imports == []
    assert k9.name == "k9 of the real module" and k8[(4,)] == ("k8 of the real module", (4,))
    assert imports == [1]
    assert k0.jit().name == "k0 of the real module"


class _Real:
    def __getattr__(self, name):
        return _RealKernel(f"{name} of the real module")


class _RealKernel:
    def __init__(self, name):
        self.name = name

    def __getitem__(self, grid):
        return self.name, grid


def test_what_the_record_cannot_vouch_for_is_imported(triton_cache, tmp_path, monkeypatch):
    root, known = triton_cache
    launches = {"k0": PLAN_A, "k1": PLAN_B}
    # a kernel compiled in the parent (no record), an older record, another plan
    assert triton_cached.load(SOURCE, launches, {"k0": known["k0"]}, _Real) is None
    assert triton_cached.load(SOURCE, launches, {**known, "k1": known["k1"][:2]}, _Real) is None
    other = ([torch.float16, torch.float32], (8,), {"XBLOCK": 128, "RBLOCK": 64}, 8)
    assert triton_cached.load(SOURCE, {**launches, "k1": other}, known, _Real) is None
    # a binary gone from Triton's cache
    os.remove(_folder(root, H1) / "__grp__k1.json")
    assert triton_cached.load(SOURCE, launches, known, _Real) is None
    # a kernel kiln's native launch cannot take (scratch memory)
    _write_group(root, H3, "k1", global_scratch_size=128)
    known3 = {**known, "k1": triton_cached.record_of(_spec("k1", SIG_B), H3, PLAN_B)}
    assert triton_cached.load(SOURCE, launches, known3, _Real) is None
    # no native launch: Triton's own launcher needs the real source object
    from kiln.runtime import triton_native_launcher

    monkeypatch.setattr(triton_native_launcher, "_native_launch", lambda: None)
    _write_group(root, H4, "k1")
    known4 = {**known, "k1": triton_cached.record_of(_spec("k1", SIG_B), H4, PLAN_B)}
    assert triton_cached.load(SOURCE, launches, known4, _Real) is None


def test_a_cached_kernel_serves_only_the_launch_it_was_compiled_for(triton_cache):
    root, known = triton_cache
    module = triton_cached.load(SOURCE, {"k0": PLAN_A, "k1": PLAN_B}, known, _Real)
    k0 = module.k0
    x, y = torch.randn(64), torch.randn(64)
    assert x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
    assert k0.serves((x, y, 8192), {"XBLOCK": 256, "num_warps": 4})  # another size, same class
    assert k0.serves((x, y, 16), {"XBLOCK": 256})  # (4 warps: Triton's default)
    assert not k0.serves((x, y, 8190), {"XBLOCK": 256, "num_warps": 4})  # not divisible by 16
    assert not k0.serves((x, y, 1), {"XBLOCK": 256, "num_warps": 4})  # 1: a constant
    assert not k0.serves((x[1:], y, 4096), {"XBLOCK": 256, "num_warps": 4})  # misaligned
    assert not k0.serves((x.double(), y, 4096), {"XBLOCK": 256, "num_warps": 4})  # dtype
    assert not k0.serves((x, y, 4096), {"XBLOCK": 512, "num_warps": 4})  # constexpr
    assert not k0.serves((x, y, 4096), {"XBLOCK": 256, "num_warps": 8})  # warps
    assert not k0.serves((x, y, 4096), {"XBLOCK": 256, "num_stages": 2})  # another option
    assert not k0.serves((x, y), {"XBLOCK": 256})  # arguments missing


PROGRAM = textwrap.dedent(
    """
    import json, sys, torch, kiln
    from kiln.runtime import triton_builder

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.GELU(),
        torch.nn.Linear(256, 64), torch.nn.Softmax(-1),
    ).cuda()
    compiled = kiln.compile(model)
    worst = 0.0
    for seed in (int(sys.argv[1]), int(sys.argv[1]) + 1):
        x = torch.randn(32, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        got = compiled(x)
        got.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        want = model(x)
        want.square().sum().backward()
        for g, p in zip(grads, model.parameters()):
            worst = max(worst, (g - p.grad).abs().max().item())
        model.zero_grad()
        worst = max(worst, (got - want).abs().max().item())
        with torch.no_grad():
            worst = max(worst, (compiled(x) - model(x)).abs().max().item())
    print(json.dumps({
        **{k: v for k, v in triton_builder.STATS.items() if not isinstance(v, float)},
        "worst": worst,
        "experimental": [m for m in sys.modules if m.startswith("triton.experimental")],
        "kernel_modules": [m for m in sys.modules if m.startswith("kiln_triton_")],
    }))
    """
)


@pytest.mark.gpu
def test_a_warm_process_launches_every_kernel_from_triton_cache(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "KILN_CACHE_DIR": str(tmp_path / "kiln"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "KILN_ARTIFACT_CACHE": "1",
    }

    def run(seed: int) -> dict:
        out = subprocess.run(
            [sys.executable, str(script), str(seed)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run(1)
    assert cold["worst"] < 1e-3, cold
    warm = run(7)  # other data than the compile saw
    assert warm["worst"] < 1e-3, warm
    assert warm["loaded_from_cache"] > 0, warm
    assert warm["loads"] == 0 and warm["kernel_modules"] == [], warm  # no JITFunction built
    assert warm["experimental"] == [], warm  # Triton's binder never ran


class _Launcher:
    """A launcher's interface (triton_native_launcher.NativeLauncher's), recording launches."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.launch = None  # (no raw entry point: later launches go through `run` too)

    def __call__(self, gx, gy, gz, stream, function, *args):
        self.calls.append(args[4:])  # after metadata and the two hooks' slots


def test_first_launch_of_a_cached_kernel_runs_it_and_others_go_to_triton(triton_cache, monkeypatch):
    from kiln.runtime import triton_launch

    root, known = triton_cache
    real_launches: list = []

    class Jit:  # the module's JITFunction, reached only through the import
        def __getitem__(self, grid):
            return lambda *args, **kwargs: real_launches.append((grid, args, kwargs))

    class Real:
        k0 = Jit()

    imports: list = []
    module = triton_cached.load(
        SOURCE, {"k0": PLAN_A, "k1": PLAN_B}, known, lambda: imports.append(1) or Real()
    )
    calls: list = []
    compiled = module.k0.compiled
    compiled._run, compiled.function = _Launcher(calls), 1234  # (loading needs a GPU)
    monkeypatch.setattr(triton_launch, "native_launchers", contextlib.nullcontext)
    monkeypatch.setattr(triton_launch, "_stream_of", lambda device: 0)
    monkeypatch.setattr(triton_launch.torch.cuda, "current_device", lambda: 0)
    kernel = triton_launch.FastKernel(module.k0)
    x, y = torch.randn(64), torch.randn(64)
    kernel[(16,)](x, y, 4096, XBLOCK=256, num_warps=4)
    assert calls == [(x, y, 4096, 256)] and imports == [] and real_launches == []
    kernel[(16,)](x, y, 4096, XBLOCK=256, num_warps=4)  # kept: launched the same way
    assert len(calls) == 2 and imports == []
    # a launch the kernel was not compiled for (a misaligned view): Triton's own path
    kernel[(8,)](x[1:], y, 4096, XBLOCK=256, num_warps=4)
    assert imports == [1] and len(real_launches) == 1 and len(calls) == 2
