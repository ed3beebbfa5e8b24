"""Backends: what runs a captured graph. `backend(gm, example_inputs) -> callable`.

registry.py holds the name -> compiler table (`kiln.register_backend`, `kiln.list_backends`);
builtin.py registers kiln's own backends; warm.py keeps `inductor`'s compiled graphs on disk for
the next process (the warm start); ddp_split.py splits a graph captured inside a
DistributedDataParallel forward at DDP's bucket boundaries (every backend kiln.compile binds);
specialize.py builds a graph with symbolic sizes per size
for a code generator that declines symbolic sizes; interop.py is the entry point that lets
`torch.compile(m, backend="kiln")` use kiln's code generator.
"""
