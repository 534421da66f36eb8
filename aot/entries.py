"""Which parameters each training entry trains, and the flat layout that serves them all.

A parameter is trained by an entry when it is trainable (not frozen) and matches the entry's
`Train(params=...)` patterns (None: every trainable parameter). The flat parameter vector
groups parameters by the set of entries that train them, so that each entry's parameters are
one contiguous range [start, end) wherever the sets allow it (always for one or two entries,
and for nested or disjoint sets): the update then reads, computes and writes one slice in one
fused kernel, and its gradient vector and optimizer state hold that range only. Frozen
parameters come last and lie in no range. Where sets overlap so that no order makes every
entry contiguous, an entry's range spans parameters it does not train; those get a zero
gradient (never computed) and keep their values (optim.append_update's `reached`).

Each entry's gradient vector and optimizer state live at one offset of their own (`offset`):
grads[offset : offset + size] and state_i[offset : offset + size], entries side by side.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from .errors import TraceError


@dataclass(frozen=True)
class TrainLayout:
    entry: str  # table name: "train" or "train_<name>"
    start: int  # [start, end) of the flat parameter vector the update covers
    end: int
    offset: int  # where its gradients and optimizer state start in the grads/state buffers
    members: tuple[str, ...]  # the parameters it trains, layout order

    @property
    def size(self) -> int:
        return self.end - self.start


def trained_by(trains: dict, named) -> dict[str, set[str]]:
    """Entry -> names of the parameters it trains. A pattern that matches no parameter, or an
    entry left with nothing to train, is an error (a typo would otherwise train nothing)."""
    names = [n for n, _ in named]
    trainable = {n for n, info in named if info.trainable}
    out = {}
    for entry, tr in trains.items():
        label = "train" if entry == "train" else f"train[{entry[len('train_'):]!r}]"
        if tr.params is None:
            chosen = set(trainable)
        else:
            chosen = set()
            for pat in tr.params:
                hit = {n for n in names if fnmatch.fnmatchcase(n, pat)}
                if not hit:
                    raise TraceError(
                        f"{label}: params pattern {pat!r} matches no parameter",
                        tr.site,
                        hint=f"the parameters are {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}",
                    )
                chosen |= hit & trainable
        if not chosen and names:  # a model without parameters trains a loss alone (issue 32)
            raise TraceError(
                f"{label}: there is no trainable parameter for it to train (all frozen or none matched)", tr.site
            )
        out[entry] = chosen
    return out


def layout_order(named, chosen: dict[str, set[str]], inner: dict | None = None) -> list:
    """`named` ((name, info) pairs) in flat-vector order: grouped by the set of entries training
    each parameter, groups ordered so each entry's are adjacent where possible (by the first and
    last entry of the group, in declaration order of the entries), frozen/untrained last; within
    a group by `inner` (name -> sort key: the optimizer's parameter groups and decay flags;
    default: decayed first), declaration order within that."""
    entries = list(chosen)
    inf = len(entries)

    def group(name):
        idx = tuple(i for i, e in enumerate(entries) if name in chosen[e])
        return (idx[0], idx[-1], idx) if idx else (inf, inf, ())

    def within(name, info):
        return inner[name] if inner and name in inner else (0, not info.decay)

    keyed = sorted(enumerate(named), key=lambda x: (group(x[1][0]), within(*x[1]), x[0]))
    return [x for _, x in keyed]


def layouts(order, sizes: dict[str, int], chosen: dict[str, set[str]]) -> dict[str, TrainLayout]:
    """Each entry's range in the flat vector laid out as `order` (names), and its offset."""
    offs, o = {}, 0
    for n in order:
        offs[n] = o
        o += sizes[n]
    out, base = {}, 0
    for entry, names in chosen.items():
        start = min((offs[n] for n in names), default=0)  # no names: a model without parameters
        end = max((offs[n] + sizes[n] for n in names), default=0)
        members = tuple(n for n in order if n in names)
        out[entry] = TrainLayout(entry, start, end, base, members)
        base += end - start
    return out
