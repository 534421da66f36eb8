"""`aot.lr`: learning-rate schedules (API.md §1). Each is plain data, so it is baked into
the generated package and evaluated there by the same code (aot/runtime/schedules.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .runtime.schedules import lr_at, normalize


@dataclass(frozen=True)
class LrSchedule:
    spec: tuple

    def __call__(self, t: int) -> float:
        """Learning rate of update t = 1, 2, ..."""
        return lr_at(self.spec, t)


def linear(peak: float, final: float, steps: int) -> LrSchedule:
    return LrSchedule(normalize(("linear", peak, final, steps)))


def cosine(peak: float, final: float, steps: int) -> LrSchedule:
    return LrSchedule(normalize(("cosine", peak, final, steps)))


def warmup(peak: float, steps: int, after) -> LrSchedule:
    return LrSchedule(normalize(("warmup", peak, steps, after)))


def step(peak: float, every: int, gamma: float) -> LrSchedule:
    return LrSchedule(normalize(("step", peak, every, gamma)))


def multistep(peak: float, milestones, gamma: float) -> LrSchedule:
    return LrSchedule(normalize(("multistep", peak, tuple(milestones), gamma)))


def sequential(first, steps: int, after) -> LrSchedule:
    """`first` (a float or schedule) for updates 1..steps, then `after` from its own update 1
    (torch.optim.lr_scheduler.SequentialLR with one milestone; nest for more)."""
    return LrSchedule(normalize(("sequential", first, steps, after)))
