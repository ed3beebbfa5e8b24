"""Which forward values to save for the backward: a minimum cut, by kiln's own max-flow.

Takes the forward half of a joint graph (nodes, their users, which ones the backward reads,
which ones may be recomputed and each value's size in bytes); gives the set of nodes to save.
Everything the backward needs and that is not saved is recomputed in the backward from saved
values.

The flow network (the formulation of "min-cut rematerialisation", as PyTorch's partitioner
also uses it): every forward node `n` is split into `n.in -> n.out` with capacity = bytes of
its value, so cutting that edge means "save n". Edges `n.out -> user.in` have infinite capacity
(a value cannot be used before it exists). The source feeds every input and every node that
must run in the forward (not recomputable: matmul, convolution, reductions, random ops); every
value the backward reads feeds the sink. A minimum cut is then the cheapest set of saved bytes
from which the backward can rebuild all it needs with cheap ops only.

Max-flow is Dinic's algorithm (BFS levels, DFS blocking flows) on integer capacities; a joint
graph of a few thousand nodes cuts in well under a second.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Iterable

INF = 1 << 62


class FlowNetwork:
    """A directed graph with integer capacities, built edge by edge, then cut once."""

    def __init__(self) -> None:
        self.index: dict[Hashable, int] = {}
        self.head: list[list[int]] = []  # vertex -> edge ids leaving it
        self.to: list[int] = []
        self.cap: list[int] = []

    def vertex(self, key: Hashable) -> int:
        if key not in self.index:
            self.index[key] = len(self.head)
            self.head.append([])
        return self.index[key]

    def add_edge(self, a: Hashable, b: Hashable, capacity: int) -> None:
        u, v = self.vertex(a), self.vertex(b)
        self.head[u].append(len(self.to))
        self.to.append(v)
        self.cap.append(capacity)
        self.head[v].append(len(self.to))  # the reverse edge, id ^ 1
        self.to.append(u)
        self.cap.append(0)

    def _levels(self, s: int, t: int) -> list[int] | None:
        level = [-1] * len(self.head)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.head[u]:
                if self.cap[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[u] + 1
                    queue.append(self.to[e])
        return level if level[t] >= 0 else None

    def _blocking_flow(self, s: int, t: int, level: list[int]) -> int:
        """Push flow along level-increasing paths until none is left (iterative DFS)."""
        nxt = [0] * len(self.head)
        total = 0
        while True:
            path: list[int] = []  # edge ids from s
            u = s
            while u != t:
                edges = self.head[u]
                while nxt[u] < len(edges):
                    e = edges[nxt[u]]
                    if self.cap[e] > 0 and level[self.to[e]] == level[u] + 1:
                        break
                    nxt[u] += 1
                if nxt[u] == len(edges):  # dead end: retreat
                    if not path:
                        return total
                    level[u] = -1
                    e = path.pop()
                    u = self.to[e ^ 1]
                    nxt[u] += 1
                    continue
                e = edges[nxt[u]]
                path.append(e)
                u = self.to[e]
            pushed = min(self.cap[e] for e in path)
            for e in path:
                self.cap[e] -= pushed
                self.cap[e ^ 1] += pushed
            total += pushed

    def min_cut(self, source: Hashable, sink: Hashable) -> tuple[int, set[Hashable]]:
        """(max-flow value, keys on the source side of a minimum cut)."""
        s, t = self.vertex(source), self.vertex(sink)
        flow = 0
        while (level := self._levels(s, t)) is not None:
            flow += self._blocking_flow(s, t, level)
            if flow >= INF:
                break
        seen = {s}
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.head[u]:
                if self.cap[e] > 0 and self.to[e] not in seen:
                    seen.add(self.to[e])
                    queue.append(self.to[e])
        keys = {k for k, i in self.index.items() if i in seen}
        return flow, keys


def _capacity(nbytes: int, distance: int) -> int:
    """Bytes, scaled so that among cuts of equal bytes the one saving values nearer to what the
    backward reads wins: it recomputes least. A residual stream is the case: saving every
    layer's sum costs as many bytes as saving the stream's first value and every layer's
    contribution, but the latter rebuilds layer l's sum from l + 1 saved tensors in the
    backward (a 6-layer nanoGPT step spent 8 ms more in backward kernels whose time grew with
    the depth). `distance`: ops between the value and the nearest one the backward reads."""
    if nbytes >= INF:
        return INF
    return nbytes * TIE_SCALE + min(distance, MAX_DISTANCE)


TIE_SCALE = 1 << 20  # more than MAX_DISTANCE times the nodes of any graph: bytes decide first
MAX_DISTANCE = 32


def _distances(order: list, users: dict, read_by_backward: set) -> dict:
    """Ops from each forward node to the nearest value the backward reads (users come after
    their producers, so one reverse pass suffices)."""
    forward = set(order)
    dist: dict = {}
    for n in reversed(order):
        if n in read_by_backward:
            dist[n] = 0
        else:
            dist[n] = 1 + min(
                (dist[u] for u in users.get(n, ()) if u in forward), default=MAX_DISTANCE
            )
    return dist


def choose_saved(
    nodes: Iterable[Hashable],
    users: dict[Hashable, list[Hashable]],
    must_compute_in_forward: set[Hashable],
    read_by_backward: set[Hashable],
    size: dict[Hashable, int],
) -> list[Hashable] | None:
    """The nodes to save; `None` if no finite cut exists (the caller then saves everything the
    backward reads). `size[n]` is `INF` for a value that cannot be saved (a tuple)."""
    net = FlowNetwork()
    source, sink = ("source",), ("sink",)
    net.vertex(source)
    net.vertex(sink)
    order = list(nodes)
    forward = set(order)
    dist = _distances(order, users, read_by_backward)
    for n in order:
        net.add_edge((n, "in"), (n, "out"), _capacity(size[n], dist[n]))
        if n in must_compute_in_forward:
            net.add_edge(source, (n, "in"), INF)
        if n in read_by_backward:
            net.add_edge((n, "out"), sink, INF)
        for u in users.get(n, ()):
            if u in forward:
                net.add_edge((n, "out"), (u, "in"), INF)
    flow, source_side = net.min_cut(source, sink)
    if flow >= INF:
        return None
    return [n for n in order if (n, "in") in source_side and (n, "out") not in source_side]
