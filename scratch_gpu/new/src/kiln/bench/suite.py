"""What `kiln bench` runs: the model suite, the presets, and the list of tasks.

Takes the command-line choices (models, compilers, modes, device, dtype, suite preset); gives
`Task`s, one per model x compiler x mode, each run by a fresh worker process (worker.py).

The model definitions stay in the repository's `benchmarks/models/` (DESIGN.md §5: benchmarks/
holds the model suite) and are loaded from there by path, under a private module name, rather
than copied into the package: they are benchmark material, not library code, they are what a
reader opens to see what was measured, and keeping them out of `src/kiln` keeps `import kiln`
and the installed package small. `models_dir()` finds them next to the source tree of an
editable install or a checkout, else under `./benchmarks/models`; `--models-dir` overrides both.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

COMPILERS = ("eager", "torch", "kiln")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
_MODULE_NAME = "kiln_benchmark_models"


@dataclass(frozen=True)
class Entry:
    """One model of a run: its name, whether it is a training step, an optional dtype and
    modes of its own (a suite keeps the costly modes for the models where they matter)."""

    model: str
    train: bool = False
    dtype: str | None = None
    modes: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        return (
            self.model + (":train" if self.train else "") + (f":{self.dtype}" if self.dtype else "")
        )


@dataclass(frozen=True)
class Suite:
    device: str
    dtype: str
    size: str
    compilers: tuple[str, ...]
    modes: tuple[str, ...]
    entries: tuple[Entry, ...]
    timing_s: float  # seconds of interleaved steady-state timing per row
    worker_timeout_s: float  # one worker (compile + check + time) is stopped after this
    budget_s: float  # the whole run: rows not started by then are skipped, with the reason
    jobs: int = 1  # workers at once; their timing phases still take turns (see cli.run_tasks)


_LAUNCH_BOUND = ("default", "reduce-overhead")

SUITES: dict[str, Suite] = {
    # 2 CPU cores; must finish with eager,torch,kiln in under 15 minutes.
    "cpu": Suite(
        device="cpu",
        dtype="float32",
        size="small",
        compilers=COMPILERS,
        modes=("default",),
        entries=(
            Entry("mlp"),
            Entry("pointwise"),
            Entry("softmax_ln"),
            Entry("nanogpt"),
            Entry("nanogpt", train=True),
            Entry("resnet"),
            Entry("hf_gpt2"),
            Entry("hf_bert"),
            Entry("hf_llama"),
            Entry("tv_resnet50"),
            Entry("timm_vit_b16"),
        ),
        timing_s=1.5,
        worker_timeout_s=240.0,
        budget_s=840.0,
    ),
    # One H200; must finish in under 10 minutes: bfloat16 inference, a float32 training step.
    # Device graphs (reduce-overhead) only where launches dominate: small per-op work.
    "gpu": Suite(
        device="cuda",
        dtype="bfloat16",
        size="large",
        compilers=COMPILERS,
        modes=_LAUNCH_BOUND,
        entries=(
            Entry("nanogpt", train=True, dtype="float32", modes=("default",)),
            Entry("nanogpt", modes=_LAUNCH_BOUND),
            Entry("mlp", modes=_LAUNCH_BOUND),
            Entry("pointwise", modes=("default",)),
            Entry("softmax_ln", modes=("default",)),
            Entry("hf_gpt2", modes=("default",)),
            Entry("hf_llama", modes=("default",)),
            Entry("resnet", modes=("default",)),
            Entry("tv_resnet50", modes=_LAUNCH_BOUND),
            Entry("timm_vit_b16", modes=("default",)),
            Entry("hf_bert", modes=("default",)),
            Entry("gpt2_decode", modes=_LAUNCH_BOUND),
        ),
        timing_s=1.0,
        worker_timeout_s=180.0,
        budget_s=540.0,
        jobs=3,
    ),
}


@dataclass(frozen=True)
class Task:
    """Everything a worker needs to measure one row; crosses the process boundary as JSON."""

    model: str
    compiler: str
    mode: str
    device: str
    dtype: str
    size: str
    train: bool
    models_dir: str
    seed: int = 0
    timing_s: float = 1.0
    threads: int | None = None  # torch.set_num_threads in the worker; None: torch's default
    with_eager: bool = False  # also give eager's row, measured in this same process
    timing_lock: str | None = None  # a file to hold locked while timing (concurrent workers)

    @property
    def rows(self) -> int:
        return 2 if self.with_eager else 1

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        eager = " (+ eager)" if self.with_eager else ""
        return f"{self.model}{':train' if self.train else ''} {self.compiler} {self.mode}{eager}"


def models_dir(override: str | None = None) -> Path:
    """The `benchmarks/models` folder to load, with a clear error when there is none."""
    candidates = (
        [Path(override)]
        if override
        else [
            Path(__file__).resolve().parents[3]
            / "benchmarks"
            / "models",  # src/kiln/bench/ -> repo
            Path.cwd() / "benchmarks" / "models",
        ]
    )
    for path in candidates:
        if (path / "__init__.py").is_file():
            return path.resolve()
    raise FileNotFoundError(
        "kiln bench: cannot find the model suite (benchmarks/models/__init__.py); looked in "
        + ", ".join(str(p) for p in candidates)
        + ". Run from a kiln checkout or pass --models-dir PATH."
    )


def load_models(directory: str | Path) -> dict:
    """Import `benchmarks/models` from `directory` (once per process); gives its MODELS dict."""
    if _MODULE_NAME in sys.modules:
        return sys.modules[_MODULE_NAME].MODELS
    init = Path(directory) / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        _MODULE_NAME, init, submodule_search_locations=[str(directory)]
    )
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_MODULE_NAME]
        raise
    return module.MODELS


def parse_entry(text: str, known: dict) -> Entry:
    """`name[:train][:dtype]`, e.g. `nanogpt:train:float32`; errors name the valid choices."""
    name, *flags = text.strip().split(":")
    if name not in known:
        raise ValueError(
            f"unknown model {name!r}.{_suggest(name, known)} Known: {', '.join(known)}"
        )
    train, dtype = False, None
    for flag in flags:
        if flag == "train":
            train = True
        elif flag in DTYPES:
            dtype = flag
        else:
            raise ValueError(
                f"model {text!r}: unknown flag {flag!r}; use name[:train][:dtype] with dtype one "
                f"of {', '.join(DTYPES)}"
            )
    return Entry(name, train=train, dtype=dtype)


def parse_choices(text: str, valid: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A comma-separated list, each item checked against `valid`."""
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise ValueError(f"--{what}: give at least one of {', '.join(valid)}")
    for item in items:
        if item not in valid:
            raise ValueError(
                f"unknown {what[:-1]} {item!r}.{_suggest(item, valid)} Valid: {', '.join(valid)}"
            )
    return items


def make_tasks(
    entries: tuple[Entry, ...],
    compilers: tuple[str, ...],
    modes: tuple[str, ...],
    *,
    device: str,
    dtype: str,
    size: str,
    models_path: str,
    timing_s: float,
    entry_modes: bool,
    seed: int = 0,
    threads: int | None = None,
) -> list[Task]:
    """One task per entry x compiler x mode. Eager has no modes, and no process of its own
    when another compiler runs: the entry's first compiled task also gives eager's row (eager is
    timed there anyway, interleaved with the compiled model), which saves a process start and a
    model build per entry. With `entry_modes`, an entry's own modes replace `modes`."""
    tasks = []
    compiled = [c for c in compilers if c != "eager"]
    common = dict(
        device=device,
        size=size,
        models_dir=models_path,
        seed=seed,
        timing_s=timing_s,
        threads=threads,
    )
    for e in entries:
        e_modes = e.modes if (entry_modes and e.modes) else modes
        pairs = [(c, m) for c in compiled for m in e_modes] or [("eager", "default")]
        for i, (compiler, mode) in enumerate(pairs):
            with_eager = i == 0 and "eager" in compilers and compiler != "eager"
            tasks.append(
                Task(
                    model=e.model,
                    compiler=compiler,
                    mode=mode,
                    dtype=e.dtype or dtype,
                    train=e.train,
                    with_eager=with_eager,
                    **common,
                )
            )
    return tasks


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
