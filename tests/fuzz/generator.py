"""Random small Python programs that mix Python features with tensor work, for differential
fuzzing (compiled against eager).

`generate(seed)` gives the source text of one module. The module defines:
- outside state: module globals (an int, a list, a dict, a set, a tensor, a log list, a dict
  keyed by objects `G_OK` and a global key `G_KEY`, subclasses of list and dict `G_DL`/`G_SD`
  that override how they are read and written), a class with a class attribute and an
  instance `OBJ` with instance attributes, and closure containers (`cell`, `cnt`) captured
  by `fn`;
- helpers the function calls (a plain function, a generator, a context manager class);
- `fn(x, y, n, lst)`: the function under test; its body is random statements drawn from the
  templates below (containers, closures, globals, attributes, comprehensions, exceptions,
  generators, `with`, branches and loops on values, on shapes and on tensor data, RNG, input
  mutation);
- `mutate(i)`: changes the outside state before call `i` (the same literal changes in the
  compiled and the eager copy of the module);
- `state()`: a snapshot of all outside state, to compare after each call;
- `CALLS`: the inputs of each call, as (batch size, n) pairs; `REQUIRES_GRAD`: x and y require
  grad, and the runner compares gradients too; `STABLE_INPUTS`: `n` and `lst` are the same on
  every call (later calls then run the first call's trace, where staleness shows).

Everything is decided by `random.Random(seed)`, so a seed names one program.
"""

from __future__ import annotations

import random

FEAT = 4  # the second dimension of x and y; the first (the batch) changes between calls
UNARY = ["sin()", "cos()", "tanh()", "relu()", "abs()", "sigmoid()", "exp().clamp(max=4.0)"]
UNARY_FN = ["torch.tanh", "torch.relu", "torch.sigmoid", "torch.neg", "torch.sin"]


class _Gen:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.tvars = ["x", "y"]  # tensors of shape (B, FEAT)
        self.svars: list[str] = []  # Python floats/ints
        self.globals_written: set[str] = set()
        self.counter = 0
        self.uses_rng = False
        self.pending: list[str] = []  # names a statement defines, visible after it

    # ---- names -----------------------------------------------------------------------------
    def new(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def tvar(self) -> str:
        return self.r.choice(self.tvars)

    def lit(self) -> str:
        return self.r.choice(["0.5", "1.5", "2", "3", "-1.25", "0.25", "1"])

    # ---- expressions -------------------------------------------------------------------------
    def scalar(self, depth: int = 0) -> str:
        """A Python number (int or float), read from somewhere in the program."""
        r = self.r
        choices = [
            lambda: self.lit(),
            lambda: "n",
            lambda: "G_K",
            lambda: "len(G_LIST)",
            lambda: "sum(G_LIST)",
            lambda: "G_D['a']",
            lambda: "G_D.get('b', 0.5)",
            lambda: "len(G_S)",
            lambda: "cell[0]",
            lambda: "cnt['n']",
            lambda: "OBJ.w",
            lambda: "C.k",
            lambda: "len(OBJ.items)",
            lambda: "x.shape[0]",
            lambda: "y.size(0) * 0.5",
            lambda: f"{self.tvar()}.dim()",
            lambda: "len(lst)",
            lambda: "(lst[-1] if lst else 0.5)",
            lambda: "max(G_LIST, default=0.0)",
            lambda: "min(n, G_K)",
            lambda: f"{self.tvar()}.numel() // 2",
            lambda: r.choice(OBJECT_KEYED),
            lambda: r.choice(SUBCLASS_READS),
        ]
        if self.svars:
            choices.append(lambda: self.r.choice(self.svars))
        if depth < 1:
            choices += [
                lambda: f"float({self.texpr(depth + 1)}.sum())",
                lambda: f"{self.texpr(depth + 1)}.mean().item()",
                lambda: f"int({self.texpr(depth + 1)}.abs().max() > 1)",
                lambda: f"({self.scalar(depth + 1)} + {self.scalar(depth + 1)})",
                lambda: f"({self.scalar(depth + 1)} * {self.scalar(depth + 1)})",
                lambda: f"abs({self.scalar(depth + 1)})",
            ]
        return r.choice(choices)()

    def texpr(self, depth: int = 0) -> str:
        """A tensor of shape (B, FEAT)."""
        r = self.r
        if depth >= 3 or r.random() < 0.25:
            return self.tvar()
        d = depth + 1
        choices = [
            lambda: f"({self.texpr(d)} + {self.texpr(d)})",
            lambda: f"({self.texpr(d)} * {self.texpr(d)})",
            lambda: f"({self.texpr(d)} - {self.texpr(d)})",
            lambda: f"{self.texpr(d)}.{r.choice(UNARY)}",
            lambda: f"{r.choice(UNARY_FN)}({self.texpr(d)})",
            lambda: f"({self.texpr(d)} * {self.lit()})",
            lambda: f"({self.texpr(d)} + {self.scalar(d)})",
            lambda: f"({self.texpr(d)} * {self.scalar(d)})",
            lambda: f"({self.texpr(d)} + {self.texpr(d)}.sum(0))",
            lambda: f"({self.texpr(d)} - {self.texpr(d)}.mean(1, keepdim=True))",
            lambda: f"torch.where({self.texpr(d)} > 0, {self.texpr(d)}, {self.texpr(d)})",
            lambda: f"{self.texpr(d)}.clamp(-2.0, 2.0)",
            lambda: f"helper({self.texpr(d)})",
            lambda: f"helper({self.texpr(d)}, k={self.lit()})",
            lambda: f"OBJ.m({self.texpr(d)})",
            lambda: f"{self.texpr(d)}.flip(0)",
            lambda: f"{self.texpr(d)}.roll(1, 0)",
            lambda: f"({self.texpr(d)} @ G_W)",
            lambda: f"{self.texpr(d)}.cumsum(0)",
            lambda: f"({self.texpr(d)} > 0).float()",
            lambda: f"torch.cat([{self.texpr(d)}[:1], {self.texpr(d)}[1:]])",
            lambda: f"{self.texpr(d)}.softmax(-1)",
            lambda: f"(G_T + {self.texpr(d)})",
            lambda: f"{self.texpr(d)}.t().contiguous().t()",
            lambda: f"{self.texpr(d)}.reshape(-1, {FEAT})",
            lambda: f"{self.texpr(d)}.view({self.tvar()}.shape)",
        ]
        return r.choice(choices)()

    # ---- statements --------------------------------------------------------------------------
    def block(self, depth: int, count: int) -> list[str]:
        lines: list[str] = []
        for _ in range(count):
            lines += self.stmt(depth)
        return lines

    def inner_block(self, depth: int, count: int) -> list[str]:
        """Statements that may not run (a branch, a loop body): the names they define are not
        visible after them."""
        nt, ns = len(self.tvars), len(self.svars)
        lines = self.block(depth, count)
        del self.tvars[nt:], self.svars[ns:]
        return lines

    def assign(self) -> tuple[str, list[str]]:
        name = self.new()
        return name, [f"{name} = {self.texpr()}"]

    def stmt(self, depth: int) -> list[str]:
        r = self.r
        kinds = [
            "assign",
            "assign",
            "assign",
            "inplace",
            "scalar",
            "if_value",
            "if_shape",
            "if_data",
            "for_range",
            "for_list",
            "while",
            "listcomp",
            "dictcomp",
            "genexpr",
            "try_key",
            "try_raise",
            "try_finally",
            "with_no_grad",
            "with_cm",
            "generator",
            "closure_mut",
            "global_mut",
            "attr_mut",
            "list_arg",
            "rng",
            "lambda",
            "nested_def",
            "unpack",
            "enumerate",
            "method_obj",
            "isinstance",
            "object_keys",
            "subclass_mut",
        ]
        if depth >= 2:
            kinds = [k for k in kinds if not k.startswith(("if_", "for_", "while", "try_", "with"))]
        kind = r.choice(kinds)
        saved, self.pending = self.pending, []
        lines = getattr(self, "s_" + kind)(depth)
        self.tvars += self.pending
        self.pending = saved
        return lines

    def _branches(self, depth: int, header: list[str], arms: list[str]) -> list[str]:
        """`header` opens the first arm, `arms` are the further arm headers ("else:")."""
        name = self.new()
        out = list(header)
        for arm in [None, *arms]:
            if arm is not None:
                out.append(arm)
            inner = self.inner_block(depth + 1, self.r.randint(0, 1))
            out += ["    " + line for line in inner]
            out.append(f"    {name} = {self.texpr()}")
        self.pending.append(name)
        return out

    def s_assign(self, depth):
        name, lines = self.assign()
        self.pending.append(name)
        return lines

    def s_inplace(self, depth):
        t = self.tvar()
        op = self.r.choice(["add_", "mul_", "sub_"])
        if self.r.random() < 0.3:
            return [f"{t}[0] = {self.texpr()}[0]"]
        return [f"{t}.{op}({self.texpr()}.tanh())"]

    def s_scalar(self, depth):
        name = self.new("s")
        line = f"{name} = {self.scalar()}"
        self.svars.append(name)
        return [line]

    def s_if_value(self, depth):
        cond = f"{self.scalar()} {self.r.choice(['>', '<', '>=', '=='])} {self.scalar()}"
        return self._branches(depth, [f"if {cond}:"], ["else:"])

    def s_if_shape(self, depth):
        t = self.tvar()
        cond = self.r.choice(
            [
                f"{t}.shape[0] > 3",
                f"{t}.size(0) % 2 == 0",
                f"{t}.shape == x.shape",
                f"{t}.ndim == 2",
            ]
        )
        return self._branches(depth, [f"if {cond}:"], ["else:"])

    def s_if_data(self, depth):
        cond = self.r.choice(
            [
                f"{self.texpr(1)}.sum() > 0",
                f"({self.texpr(1)} > 0.5).any()",
                f"{self.texpr(1)}.max().item() > 1.0",
            ]
        )
        return self._branches(depth, [f"if {cond}:"], ["else:"])

    def s_for_range(self, depth):
        name = self.new()
        k = self.r.choice(["2", "3", "n", "G_K % 4", "x.shape[0] // 2"])
        body = self.inner_block(depth + 1, self.r.randint(0, 1))
        lines = [f"{name} = {self.tvar()}", f"for i in range({k}):"]
        lines += ["    " + line for line in body]
        lines.append(f"    {name} = {name} * 0.5 + {self.texpr()} * i")
        self.pending.append(name)
        return lines

    def s_for_list(self, depth):
        name = self.new()
        src = self.r.choice(["G_LIST", "list(G_D.values())", "sorted(G_S)", "OBJ.items", "lst"])
        lines = [f"{name} = {self.tvar()}", f"for v in {src}:"]
        lines.append(f"    {name} = {name} * 0.5 + {self.texpr()} * v")
        self.pending.append(name)
        return lines

    def s_while(self, depth):
        name = self.new()
        lines = [
            f"{name} = {self.tvar()}",
            "j = 0",
            f"while j < {self.r.choice(['n', '2', 'G_K'])}:",
        ]
        lines += [f"    {name} = {name} + {self.texpr()} * 0.25", "    j += 1"]
        if self.r.random() < 0.3:
            lines += ["    if j > 3:", "        break"]
        self.pending.append(name)
        return lines

    def s_listcomp(self, depth):
        name = self.new()
        src = self.r.choice(["G_LIST", "range(3)", "OBJ.items", "[cell[0], C.k]"])
        t = self.tvar()
        cond = self.r.choice(["", " if v != 2", " if v > 0"])
        self.pending.append(name)
        return [f"{name} = sum([{self.texpr()} * v for v in {src}{cond}], {t} * 0)"]

    def s_dictcomp(self, depth):
        name, d = self.new(), self.new("d")
        self.pending.append(name)
        return [
            f"{d} = {{k: {self.texpr()} * v for k, v in G_D.items()}}",
            f"{name} = {d}['a'] + len({d})",
        ]

    def s_genexpr(self, depth):
        name = self.new()
        self.pending.append(name)
        t = self.tvar()
        return [f"{name} = sum(({t} * v for v in G_LIST), {self.texpr()})"]

    def s_try_key(self, depth):
        name = self.new()
        key = self.r.choice(["'a'", "'b'", "'c'"])
        lines = [
            "try:",
            f"    {name} = {self.texpr()} * G_D[{key}]",
            "except KeyError:",
            f"    {name} = {self.texpr()}",
        ]
        self.pending.append(name)
        return lines

    def s_try_raise(self, depth):
        name = self.new()
        cond = self.r.choice(
            [f"{self.scalar()} > {self.scalar()}", f"{self.texpr(1)}.sum() > 0", "n % 2 == 0"]
        )
        exc = self.r.choice(["ValueError", "RuntimeError", "KeyError"])
        lines = [
            "try:",
            f"    if {cond}:",
            f"        raise {exc}('boom')",
            f"    {name} = {self.texpr()}",
            f"except {exc} as e:",
            f"    {name} = {self.texpr()} + len(str(e))",
        ]
        self.pending.append(name)
        return lines

    def s_try_finally(self, depth):
        name = self.new()
        lines = ["try:", f"    {name} = {self.texpr()}", "finally:", "    cnt['n'] += 1"]
        self.pending.append(name)
        return lines

    def s_with_no_grad(self, depth):
        name = self.new()
        mgr = self.r.choice(
            ["torch.no_grad()", "torch.enable_grad()", "torch.inference_mode(False)"]
        )
        lines = [f"with {mgr}:", f"    {name} = {self.texpr()}"]
        self.pending.append(name)
        return lines

    def s_with_cm(self, depth):
        name = self.new()
        tag = self.r.choice(["'p'", "'q'", "n"])
        lines = [f"with CM({tag}) as scale:", f"    {name} = {self.texpr()} * scale"]
        self.pending.append(name)
        return lines

    def s_generator(self, depth):
        name = self.new()
        self.pending.append(name)
        k = self.r.choice(["2", "3", "n"])
        return [f"{name} = sum(gen({self.texpr()}, {k}), {self.tvar()} * 0)"]

    def s_closure_mut(self, depth):
        return [
            self.r.choice(
                [
                    "cnt['n'] += 1",
                    f"cell[0] = cell[0] * 0.5 + {self.lit()}",
                    f"cnt['m'] = cnt.get('m', 0) + {self.scalar()}",
                    f"cell.append({self.lit()})",
                ]
            )
        ]

    def s_global_mut(self, depth):
        which = self.r.choice(["G_K", "G_LIST", "G_D", "G_S", "LOG"])
        if which == "G_K":
            self.globals_written.add("G_K")
            return [f"G_K = G_K + {self.r.choice(['1', '2', 'n'])}"]
        return [
            {
                "G_LIST": f"G_LIST.append({self.scalar()})",
                "G_D": f"G_D[{self.r.choice(['a', 'b', 'e'])!r}] = {self.scalar()}",
                "G_S": f"G_S.add({self.r.choice(['1', '7', 'n'])})",
                "LOG": f"LOG.append(({self.r.choice(['1', 'n', 'len(lst)'])}, 'fn'))",
            }[which]
        ]

    def s_attr_mut(self, depth):
        return [
            self.r.choice(
                [
                    f"OBJ.w = OBJ.w * 0.5 + {self.lit()}",
                    f"OBJ.items.append({self.r.choice(['1', 'n', 'len(lst)'])})",
                    "C.k = C.k + 1",
                    f"OBJ.extra = {self.scalar()}",
                ]
            )
        ]

    def s_list_arg(self, depth):
        return [
            self.r.choice(
                [
                    f"lst.append({self.scalar()})",
                    "lst.pop() if lst else None",
                    f"lst[:] = [v * 2 for v in lst] + [{self.lit()}]",
                ]
            )
        ]

    def s_rng(self, depth):
        name = self.new()
        self.uses_rng = True
        self.pending.append(name)
        return [
            self.r.choice(
                [
                    f"{name} = {self.texpr()} + torch.rand_like(x) * 0.1",
                    f"{name} = {self.texpr()} * torch.randn(x.shape[0], {FEAT}).sigmoid()",
                    f"{name} = {self.texpr()} + torch.nn.functional.dropout(y, 0.5)",
                ]
            )
        ]

    def s_lambda(self, depth):
        name, f = self.new(), self.new("f")
        self.pending.append(name)
        return [
            f"{f} = lambda t: t * {self.scalar()} + {self.tvar()}",
            f"{name} = {f}({self.texpr()})",
        ]

    def s_nested_def(self, depth):
        name, f = self.new(), self.new("f")
        captured = self.tvar()
        self.pending.append(name)
        return [
            f"def {f}(t, k=2):",
            f"    return t * k + {captured}.tanh()",
            f"{name} = {f}({self.texpr()}) + {f}({self.tvar()}, k={self.lit()})",
        ]

    def s_unpack(self, depth):
        a, b = self.new(), self.new()
        self.pending += [a, b]
        if self.r.random() < 0.5:
            return [f"{a}, {b} = {self.texpr()}, {self.texpr()}"]
        return [f"{a}, *rest = [{self.texpr()}, {self.tvar()}, {self.tvar()}]", f"{b} = sum(rest)"]

    def s_enumerate(self, depth):
        name = self.new()
        self.pending.append(name)
        return [
            f"{name} = {self.tvar()}",
            "for i, (v, w) in enumerate(zip(G_LIST, OBJ.items)):",
            f"    {name} = {name} + {self.tvar()} * (v - w * i)",
        ]

    def s_method_obj(self, depth):
        name = self.new()
        self.pending.append(name)
        return [f"{name} = OBJ.m({self.texpr()}) + C.scale({self.tvar()})"]

    def s_isinstance(self, depth):
        name = self.new()
        self.pending.append(name)
        return [
            "if isinstance(G_D.get('b'), float) or hasattr(OBJ, 'extra'):",
            f"    {name} = {self.texpr()}",
            "else:",
            f"    {name} = {self.texpr()} + 1",
        ]

    def s_object_keys(self, depth):
        name = self.new()
        self.pending.append(name)
        t = self.tvar()
        if self.r.random() < 0.5:
            return [
                f"{name} = {t}",
                "for k, v in G_OK.items():",
                f"    {name} = {name} * 0.5 + {self.texpr()} * v * len(k.name)",
            ]
        return [
            f"{name} = {self.texpr()} * G_OK.get(G_KEY, 0.5) if G_KEY in G_OK else {t}",
        ]

    def s_subclass_mut(self, depth):
        """Changes, inside the function, to the dict keyed by objects and to the subclasses."""
        return [
            self.r.choice(
                [
                    f"G_OK[KC] = {self.scalar()}",
                    "G_OK.pop(KB, None)",
                    f"G_DL.append({self.scalar()})",
                    f"G_SD['b'] = {self.scalar()}",
                    "G_SD.pop('b', None)",
                ]
            )
        ]

    # ---- outside state changes ---------------------------------------------------------------
    def mutation(self) -> str:
        r = self.r
        v = r.choice(["0.5", "2.0", "-1.0", "3", "1"])
        return r.choice(
            [
                "G_K = G_K + 1",
                f"G_LIST.append({v})",
                "G_LIST.pop() if G_LIST else None",
                f"G_D['a'] = {v}",
                f"G_D['b'] = {v}",
                "G_D.pop('b', None)",
                f"G_S.add({r.randint(0, 9)})",
                "G_S.discard(1)",
                f"CELL[0] = {v}",
                f"CNT['n'] = {r.randint(0, 3)}",
                f"OBJ.w = {v}",
                f"C.k = {r.randint(0, 4)}",
                "OBJ.items.append(2)",
                "G_T = G_T * 0.5",
                "G_W.mul_(0.9)",
                "OBJ.__dict__.pop('extra', None)",
                self.object_mutation(r.choice(list(OBJECT_STATE))),
            ]
        )

    def object_mutation(self, name: str) -> str:
        """A change to one of the objects-and-subclasses globals (OBJECT_STATE)."""
        r = self.r
        v = r.choice(["0.5", "2.0", "-1.0", "3"])
        return {
            "G_OK": r.choice([f"G_OK[{r.choice(['KA', 'KB', 'KC'])}] = {v}", "G_OK.pop(KA, None)"]),
            "G_KEY": f"G_KEY = {r.choice(['KA', 'KB', 'KC'])}",
            "G_DL": r.choice([f"G_DL.append({v})", f"G_DL[:] = [{v}]"]),
            "G_SD": r.choice([f"G_SD[{r.choice(['a', 'b'])!r}] = {v}", "G_SD.pop('b', None)"]),
        }[name]


# the globals keyed by objects or made of container subclasses: a program that reads one also
# changes it between two of its calls, most of the time (the change is what a stale trace
# would miss)
OBJECT_STATE = ("G_OK", "G_KEY", "G_DL", "G_SD")


# reads of a dict keyed by objects (identity-hashed `Key`s, a global key rebound between calls)
OBJECT_KEYED = [
    "G_OK.get(KA, 0.5)",
    "G_OK.get(G_KEY, 0.25)",
    "len(G_OK)",
    "(2.0 if KB in G_OK else 1.0)",
    "sum(G_OK.values())",
    "(1.0 if G_KEY is KA else 3.0)",
]
# reads of container subclasses that override how they are read (DL, SD in HEADER)
SUBCLASS_READS = [
    "(G_DL[0] if len(G_DL) > 1 else 0.5)",
    "sum(G_DL)",
    "len(G_DL)",
    "G_SD['a']",
    "G_SD.get('b', 0.5)",
    "sum(v for _, v in G_SD.items())",
]


HEADER = f"""\
import random
import torch

FEAT = {FEAT}
G_K = {{g_k}}
G_LIST = {{g_list}}
G_D = {{g_d}}
G_S = {{g_s}}
G_W = torch.randn(FEAT, FEAT, generator=torch.Generator().manual_seed({{wseed}})) * 0.5
G_T = torch.randn(FEAT, generator=torch.Generator().manual_seed({{wseed}} + 1))
LOG = []


class C:
    k = {{c_k}}

    def __init__(self):
        self.w = {{obj_w}}
        self.items = [1, 2]

    def m(self, t):
        return t * self.w + C.k

    @classmethod
    def scale(cls, t):
        return t * (cls.k + 1)


OBJ = C()


class Key:  # hashed and compared by identity
    def __init__(self, name):
        self.name = name


KA, KB, KC = Key('a'), Key('bb'), Key('ccc')
G_OK = {{g_ok}}
G_KEY = KA


class DL(list):
    def __getitem__(self, i):
        return super().__getitem__(i) * 2

    def __len__(self):
        return super().__len__() + 1


class SD(dict):
    def __getitem__(self, k):
        return super().__getitem__(k) + 1

    def __setitem__(self, k, v):
        super().__setitem__(k, v * 2)

    def get(self, k, default=None):
        return self[k] if k in self else default

    def items(self):
        return [(k, self[k]) for k in self]


G_DL = DL({{g_dl}})
G_SD = SD(a={{g_sd}})


class CM:
    def __init__(self, tag):
        self.tag = tag

    def __enter__(self):
        LOG.append(('enter', self.tag))
        return 0.5

    def __exit__(self, *exc):
        LOG.append(('exit', self.tag))
        return False


def helper(t, k=2):
    return t * k + G_K


def gen(t, k):
    for i in range(k):
        yield t * (i + 1)


def _make():
    cell = [0.5]
    cnt = {{{{'n': 0}}}}

    def fn(x, y, n, lst):
{{body}}

    return fn, cell, cnt


fn, CELL, CNT = _make()


def mutate(i):
    global G_K, G_T, G_KEY
{{mutate}}


def state():
    return {{{{
        'G_K': G_K, 'G_LIST': list(G_LIST), 'G_D': dict(G_D), 'G_S': set(G_S), 'LOG': list(LOG),
        'G_W': G_W, 'G_T': G_T, 'C.k': C.k, 'OBJ': dict(OBJ.__dict__), 'cell': list(CELL),
        'cnt': dict(CNT), 'G_OK': [(k.name, v) for k, v in G_OK.items()], 'G_KEY': G_KEY.name,
        'G_DL': list(list.__iter__(G_DL)), 'G_SD': dict(dict.items(G_SD)),
    }}}}


CALLS = {{calls}}
USES_RNG = {{uses_rng}}
REQUIRES_GRAD = {{requires_grad}}
STABLE_INPUTS = {{stable}}
"""


def generate(seed: int) -> str:
    """The source of program `seed` (see the module docstring for what it defines)."""
    g = _Gen(seed)
    r = g.r
    body = g.block(0, r.randint(2, 7))
    outs = g.tvars[-3:] if len(g.tvars) > 2 else g.tvars
    extra = [r.choice(["n", "cnt['n']", "len(lst)", "G_K"])]
    if g.svars:
        extra.append(g.svars[-1])
    ret = f"return ({', '.join(outs + extra)},)"
    decl = [f"global {', '.join(sorted(g.globals_written))}"] if g.globals_written else []
    # `cell`/`cnt` must be closure cells of fn even when the body never names them
    lines = [*decl, "cell, cnt", *body, ret]
    body_text = "\n".join("        " + line for line in lines)
    ncalls = 4
    batches = [r.choice([3, 4, 5]) for _ in range(ncalls)]
    if r.random() < 0.5:
        batches = [batches[0]] * ncalls
    calls = [(b, r.randint(0, 4)) for b in batches]
    # half the programs get the same `n` and `lst` on every call: their later calls reuse the
    # first call's trace, so a fact it read and did not guard shows as a stale result
    stable = r.random() < 0.5
    if stable:
        calls = [(b, calls[0][1]) for b in batches]
    muts = []
    targeted: dict[int, list[str]] = {}
    for name in OBJECT_STATE:
        if name in body_text and r.random() < 0.7:
            targeted.setdefault(r.randint(1, ncalls - 1), []).append(g.object_mutation(name))
    for i in range(ncalls):
        picks = [g.mutation() for _ in range(r.randint(0, 2))] + targeted.get(i, [])
        if picks:
            muts.append(f"    if i == {i}:")
            muts += [f"        {m}" for m in picks]
    mutate = "\n".join(muts) or "    pass"
    keys = r.sample(["KA", "KB"], r.randint(1, 2))
    requires_grad = r.random() < 0.3  # x and y require grad: gradients are compared too
    return HEADER.format(
        g_k=r.randint(1, 4),
        g_list=[r.choice([0.5, 1.0, 2.0, -1.0]) for _ in range(r.randint(0, 3))],
        g_d={"a": r.choice([0.5, 2.0, 1.5])},
        g_s=set(r.sample(range(5), r.randint(1, 3))),
        wseed=r.randint(0, 10_000),
        c_k=r.randint(0, 3),
        obj_w=r.choice([0.5, 1.5, -0.5]),
        body=body_text,
        mutate=mutate,
        calls=calls,
        uses_rng=g.uses_rng,
        g_ok="{" + ", ".join(f"{k}: {r.choice([0.5, 2.0, -1.0])}" for k in keys) + "}",
        g_dl=[r.choice([0.5, 1.0, 2.0]) for _ in range(r.randint(0, 2))],
        g_sd=r.choice([0.5, 1.5, -2.0]),
        requires_grad=requires_grad,
        stable=stable,
    )
