"""Training entries of a Model: each has its own optimizer, optimizer state, lr schedule and step
count, like one torch.optim optimizer each (a GAN's step_d and step_g), and its own range of the
flat parameter vector; the parameters themselves are shared in GPU memory by every entry.

A program built with train=aot.Train(...) has one entry, "train" (step/step_many); with a dict,
one per key (step_<name>/step_many_<name>). PROGRAM["trains"] describes them where they differ
from one entry over every parameter (pipeline.train_tables); frozen parameters are in no entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import schedules


@dataclass
class TrainEntry:
    table: str  # its entry in PROGRAM["signatures"]: "train" or "train_<name>"
    name: str  # what the user calls it: "train" or the dict key
    opt: tuple | None  # the optimizer spec
    lr: object  # the lr spec in use (set_lr replaces it)
    start: int  # its range [start, start + size) of the flat parameter vector
    size: int
    offset: int  # where its gradients and optimizer state start in the grads/state buffers
    params: list = field(default_factory=list)  # the parameters it trains (grads() lists these)
    n_state: int = 0  # optimizer state vectors: its slice of each of the first n_state state buffers
    groups: list = field(default_factory=list)  # its optimizer's parameter groups: [(spec, lr spec)]
    group_lrs: list = field(default_factory=list)  # [lr spec, origin] of each group (set_lr(group=i))
    count: int = 0  # its steps taken (the optimizer's step: bias correction, lr schedule)
    lr_origin: int = 0  # its count when set_lr last ran (a schedule restarts from there)


def train_entries(program: dict, total: int) -> dict[str, TrainEntry]:
    """Table name -> TrainEntry for each training entry of a package's PROGRAM."""
    tables = program.get("trains")
    if tables is None:  # one entry over every parameter (no "trains" table)
        if "train" not in program["signatures"]:
            return {}
        everything = [n for n, *_ in program["params"]]
        tables = {"train": {"name": "train", "optimizer": program.get("optimizer"), "lr": program.get("lr"),
                            "start": 0, "size": total, "offset": 0, "params": everything,
                            "state": program.get("state", []), "groups": program.get("groups") or []}}
    out = {}
    for table, t in tables.items():
        lr = schedules.normalize(t["lr"]) if t["lr"] is not None else None
        groups = list(t.get("groups") or [])
        out[table] = TrainEntry(table, t["name"], t["optimizer"], lr, t["start"], t["size"], t["offset"],
                                list(t["params"]), len(t["state"]), groups,
                                [[schedules.normalize(g_lr), 0] for _, g_lr in groups])
    return out


class TrainsMixin:
    """The per-entry part of ModelBase: entry lookup, lr, step counts, gradients and the
    checkpoint members of entries. Uses the Model's _trains, _program, _lock, _check_open,
    _engine, _params and step_count."""

    def _train_entry(self, entry=None, method: str = "") -> TrainEntry:
        """The entry a call means: `entry` by name, or the only one when None."""
        what = f"{method}(): " if method else ""
        if not self._trains:
            raise RuntimeError(f"{what}{self._program['name']} was built without train=: it has no optimizer")
        if entry is None:
            if len(self._trains) == 1:
                return next(iter(self._trains.values()))
            raise TypeError(f"{what}this model has several training entries ({', '.join(self.train_entries)}); "
                            "say which with entry=")
        for e in self._trains.values():
            if e.name == entry:
                return e
        raise KeyError(f"{what}no training entry {entry!r}; this model has {', '.join(self.train_entries)}")

    @property
    def _lr_origin(self) -> int:
        """The single training entry's lr origin (its step count when set_lr last ran)."""
        return self._train_entry().lr_origin

    @property
    def train_entries(self) -> list[str]:
        """The training entries' names: ["train"] for train=aot.Train(...), else the dict's keys."""
        return [e.name for e in self._trains.values()]

    @property
    def step_counts(self) -> dict:
        """Steps each training entry has taken (its optimizer's step count, which drives its bias
        correction and lr schedule). step_count is their sum: every training step of any entry."""
        return {e.name: e.count for e in self._trains.values()}

    @property
    def lr(self):
        """The learning-rate spec in use (a float or a schedule tuple); with several training
        entries, a dict of them by entry."""
        if len(self._trains) > 1:
            return {e.name: e.lr for e in self._trains.values()}
        return next(iter(self._trains.values())).lr if self._trains else None

    def set_lr(self, lr, group=None, entry: str | None = None) -> None:
        """A float, or a schedule spec such as ("linear", 5e-3, 5e-4, 1500) or an aot.lr schedule,
        for the training entry `entry` (None: the only one). A schedule starts at its own step 1 on
        that entry's next step; its step count keeps counting. With parameter groups, `group=i`
        sets groups[i]'s lr, `group="default"` the lr of the params no group matches, and
        group=None every group's."""
        with self._lock:
            self._check_open()
            e = self._train_entry(entry, "set_lr")
            if e.opt is None:
                raise RuntimeError("this program was built without an optimizer (optimizer=None)")
            which = _group_index(e, group)
            lr = schedules.normalize(lr)
            if which is None or which == "default":
                e.lr, e.lr_origin = lr, e.count
            for i, g in enumerate(e.group_lrs):
                if which is None or which == i:
                    g[:] = [lr, e.count]

    def current_lr(self, group="default", entry: str | None = None) -> float:
        """The learning rate the entry's next step will use (of groups[group] for an int `group`)."""
        e = self._train_entry(entry, "current_lr")
        which = _group_index(e, group)
        if which is None:
            raise TypeError("current_lr(group=None): name one group, an int or 'default'")
        lr, origin = (e.lr, e.lr_origin) if which == "default" else e.group_lrs[which]
        return schedules.lr_at(lr, e.count + 1 - origin)

    def _reset_entry(self, e: TrainEntry) -> None:
        """reset(entry=...): zero the entry's optimizer state and gradients, restart its count."""
        zeros = np.zeros(e.size, dtype=np.float32)
        buffers = [a for a, _ in self._state_buffers()][: e.n_state]
        for arena in buffers + (["grads"] if e.size else []):
            self._engine.write(arena, e.offset, zeros)
        e.count = e.lr_origin = 0
        for g in e.group_lrs:
            g[1] = 0

    def _opt_scalars(self, e: TrainEntry, t: int) -> dict:
        """The optimizer's per-step inputs of the entry's step t (1, 2, ...), every group's."""
        if e.opt is None:
            return {}
        group_lrs = [schedules.lr_at(g, t - o) for g, o in e.group_lrs]
        return schedules.step_scalars(tuple(e.opt), schedules.lr_at(e.lr, t - e.lr_origin), t, e.groups, group_lrs)

    def _entry_grads(self, entry=None) -> dict:
        """grads(): the entry's trained parameters' gradients from its last step."""
        e = self._train_entry(entry, "grads")
        flat = self._engine.read("grads", e.offset, e.size) if e.size else np.zeros(0, np.float32)
        shapes = {n: (s, o) for n, s, _, _, o in self._params}
        out = {}
        for n in e.params:
            s, o = shapes[n]
            k = int(np.prod(s, dtype=np.int64))
            out[n] = flat[o - e.start : o - e.start + k].reshape(s).copy()
        return out

    # ---- checkpoints: with several entries, each one's count and lr -------------------------
    def _trains_layout(self, lr_text: int) -> dict:
        if len(self._trains) < 2:
            return {}
        out = {}
        for e in self._trains.values():
            out[f"__train__/{e.name}/step_count"] = ("i8", ())
            out[f"__train__/{e.name}/lr"] = (("str", lr_text), ())
            out[f"__train__/{e.name}/lr_origin"] = ("i8", ())
            for i in range(len(e.group_lrs)):
                out[f"__train__/{e.name}/lr_g{i}"] = (("str", lr_text), ())
                out[f"__train__/{e.name}/lr_origin_g{i}"] = ("i8", ())
        return out

    def _trains_save(self) -> dict:
        if len(self._trains) < 2:
            return {}
        out = {}
        for e in self._trains.values():
            out[f"__train__/{e.name}/step_count"] = np.array(e.count, dtype=np.int64)
            out[f"__train__/{e.name}/lr"] = np.array(repr(e.lr))
            out[f"__train__/{e.name}/lr_origin"] = np.array(e.lr_origin, dtype=np.int64)
            for i, (lr, origin) in enumerate(e.group_lrs):
                out[f"__train__/{e.name}/lr_g{i}"] = np.array(repr(lr))
                out[f"__train__/{e.name}/lr_origin_g{i}"] = np.array(origin, dtype=np.int64)
        return out

    def _trains_read(self, path, z: dict, parse_lr) -> list:
        """[(entry, count, lr, lr origin, [[group lr, origin], ...])] of a read checkpoint, each
        checked (nothing changes yet)."""
        out = []
        for e in self._trains.values() if len(self._trains) > 1 else ():
            key = f"__train__/{e.name}/"
            count, origin = z[key + "step_count"], z[key + "lr_origin"]
            if not 0 <= count < 2**62:
                raise ValueError(f"{path}: checkpoint member {key + 'step_count'!r} must be a step count >= 0, got {count}")
            if not 0 <= origin <= count:
                raise ValueError(f"{path}: checkpoint member {key + 'lr_origin'!r} must be in [0, {count}], got {origin}")
            try:
                lr = parse_lr(z[key + "lr"])
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}: checkpoint member {key + 'lr'!r} is not a learning rate or schedule: {err}") from None
            if (lr is None) != (e.opt is None):
                raise ValueError(f"{path}: checkpoint member {key + 'lr'!r} is {lr!r}, which does not fit the entry's optimizer")
            groups = []
            for i in range(len(e.group_lrs)):
                g_origin = z[key + f"lr_origin_g{i}"]
                if not 0 <= g_origin <= count:
                    raise ValueError(f"{path}: checkpoint member {key + f'lr_origin_g{i}'!r} must be in [0, {count}], got {g_origin}")
                try:
                    g_lr = parse_lr(z[key + f"lr_g{i}"])
                    if g_lr is None:
                        raise ValueError("None is not a learning rate")
                except (TypeError, ValueError) as err:
                    raise ValueError(f"{path}: checkpoint member {key + f'lr_g{i}'!r} is not a learning rate or schedule: {err}") from None
                groups.append([g_lr, g_origin])
            out.append((e, count, lr, origin, groups))
        return out


def _group_index(e: TrainEntry, group):
    """None, "default" or an index into the entry's optimizer's groups (IndexError/TypeError else)."""
    if group is None or group == "default":
        return group
    if isinstance(group, bool) or not isinstance(group, int):
        raise TypeError(f"group must be an int index into the optimizer's groups, 'default' or None, got {group!r}")
    if not 0 <= group < len(e.group_lrs):
        raise IndexError(f"group {group} out of range: the optimizer has {len(e.group_lrs)} parameter group(s)")
    return group
