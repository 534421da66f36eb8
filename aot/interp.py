"""NumPy reference interpreter: executes any graph (forward, backward, optimizer update).

This is the oracle every GPU kernel is tested against. `dtype=np.float64` runs f32 math
in double precision (for finite-difference gradient checks).
"""

from __future__ import annotations

import numpy as np

from .buffers import UPDATE_PREFIX
from .frontend import Traced
from .ir import Graph
from .ops.registry import lookup
from .runtime.rng import init_param, step_seed
from .optim_groups import group_table
from .runtime.schedules import lr_at, normalize, step_scalars


def run(g: Graph, leaves: dict[str, np.ndarray], dtype=np.float32) -> dict[int, np.ndarray]:
    """Evaluate every node; `leaves` maps input/param/state names to arrays. Returns id(tensor) -> value."""
    env: dict[int, np.ndarray] = {}
    fdt = np.dtype(dtype)
    for n in g.nodes:
        if n.op in ("input", "param", "state", "buffer"):
            name = n.attrs["name"]
            if name not in leaves:
                raise KeyError(f"{g.name}: no value given for {n.op} {name!r}")
            v = np.asarray(leaves[name])
            if v.shape != n.out.shape:
                raise ValueError(f"{g.name}: {n.op} {name!r} expects shape {n.out.shape}, got {v.shape}")
        else:
            v = lookup(n.op).ref(*[env[id(t)] for t in n.inputs], **n.attrs)
        v = np.asarray(v)
        v = v.astype(fdt if n.out.dtype == "f32" else np.int32, copy=False)
        env[id(n.out)] = v
    return env


class Reference:
    """A traced program trained by the interpreter: the oracle for the generated package."""

    def __init__(self, traced: Traced, seed: int | None = None, dtype=np.float32):
        self.traced = traced
        self.dtype = dtype
        self.seed = traced.program.seed if seed is None else seed
        self.order = sorted(traced.params, key=lambda p: p.offset)
        tr = traced.program.train
        if isinstance(tr, dict):
            raise NotImplementedError("Reference runs programs with one training entry (train=aot.Train(...))")
        self.opt = tr.optimizer if tr is not None else None
        self.lr_spec = normalize(self.opt.lr) if self.opt is not None else None
        self.reset()

    def reset(self):
        self.params = {
            p.name: init_param(p.init, p.shape, self.seed, i).astype(self.dtype)
            for i, p in enumerate(self.traced.params)
        }
        lay = self.traced.trains.get("train")
        total = lay.size if lay is not None else sum(p.size for p in self.order)  # frozen params have no state
        names = self.opt.state_names() if self.opt is not None else ()
        self.state = {n: np.zeros(total, dtype=self.dtype) for n in names}
        # buffers: the package's streams (runtime/state.py: after the parameters')
        n = len(self.traced.params)
        self.buffers = {
            b.name: (np.rint(init_param(b.init, b.shape, self.seed, n + j)).astype(np.int32) if b.dtype == "i32"
                     else init_param(b.init, b.shape, self.seed, n + j).astype(self.dtype))
            for j, b in enumerate(self.traced.buffers)
        }
        self.step_count = 0
        self.last_grads: dict[str, np.ndarray] = {}

    def _graph(self, entry: str, inputs: dict) -> Graph:
        for key, sizes in self.traced.variants[entry].items():
            g = self.traced.graphs[key]
            if all(np.shape(inputs[k]) == g.inputs[k].shape for k in inputs if k in g.inputs):
                return g
        raise ValueError(f"no {entry} variant fits input shapes {[np.shape(v) for v in inputs.values()]}")

    def step(self, **inputs) -> float:
        g = self._graph("train", inputs)
        t = self.step_count + 1
        leaves = dict(inputs, **self.params, **self.state, **self.buffers)
        if self.opt is not None:
            groups = group_table(self.opt)
            group_lrs = [lr_at(lr, t) for _, lr in groups or ()]
            leaves.update(step_scalars(self.opt.spec(), lr_at(self.lr_spec, t), t, groups, group_lrs))
        leaves["_rng"] = np.int32(step_seed(self.seed, t))
        leaves = {k: np.asarray(v, dtype=self.dtype) if np.asarray(v).dtype.kind == "f" else np.asarray(v) for k, v in leaves.items()}
        env = run(g, leaves, self.dtype)
        self.last_grads = {k: env[id(t_)] for k, t_ in g.grads.items()}
        for name, t_ in g.updates.items():
            val = env[id(t_)]
            if name == "params":
                start, end, _ = g.meta["train_range"]
                for p in self.order:
                    if start <= p.offset < end:
                        self.params[p.name] = val[p.offset - start : p.offset - start + p.size].reshape(p.shape).copy()
            elif name.startswith(UPDATE_PREFIX):
                self.buffers[name[len(UPDATE_PREFIX) :]] = val.copy()
            else:
                self.state[name] = val.copy()
        self.step_count = t
        return float(env[id(g.outputs["loss"])])

    def predict(self, entry: str = "predict", **inputs) -> np.ndarray:
        g = self._graph(entry, inputs)
        # the generated package's numbering of infer calls' random streams (runtime/model.py)
        self.infer_calls = getattr(self, "infer_calls", 0) + 1
        leaves = dict(inputs, **self.params, **self.buffers, _rng=np.int32(step_seed(self.seed, -self.infer_calls)))
        env = run(g, leaves, self.dtype)
        return env[id(g.outputs["out"])]
