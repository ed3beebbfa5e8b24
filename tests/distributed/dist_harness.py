"""Run a test body on 2 processes joined by torch.distributed (gloo, 127.0.0.1, a free port).

`spawn(worker, *args)` starts `world` fresh processes (spawn start method: no state inherited
from pytest), each running `worker(rank, world, *args)` inside an initialised process group;
an exception on any rank fails the test with that rank's traceback, and a run past `timeout`
seconds (a hang in a collective) is killed and fails the test. Workers must be module-level
functions of an importable test module (pickled by name).
"""

from __future__ import annotations

import os
import socket
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker, *args, world: int = 2, timeout: float = 240.0) -> None:
    ctx = mp.start_processes(
        _entry,
        args=(worker, world, free_port(), args),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"distributed test did not finish in {timeout:.0f} s (a hang?)")


def _entry(rank: int, worker, world: int, port: int, args: tuple) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)  # two ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import kiln

        # a frame kiln runs eagerly says so with this warning: here it fails the test
        warnings.simplefilter("error", kiln.KilnEagerWarning)
        worker(rank, world, *args)
    finally:
        dist.destroy_process_group()
