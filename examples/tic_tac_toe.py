"""tensorgrad's tic-tac-toe sample: self-play REINFORCE, the game in NumPy.

State: 27 binary features from the point of view of the player to move, 3 channels x 9 cells
(feature c * 9 + cell; channels empty, mine, theirs). Policy: 27 -> 64 -> 64 -> 9 with tanh
(6,537 params); `predict` returns softmax(logits) over the 9 cells.

A rollout plays K = 16 games in lockstep, both sides by the same policy: one `predict` call per
move on the GPU, illegal cells masked on the host before sampling. Slot g * 9 + m holds move m of
game g (144 slots). Each game's outcome (+1 win, 0 draw, -1 loss) is credited to every move of
the player concerned, then normalized (mean/std) over the moves played.
Loss = -sum(log pi(a | s) * outcome * mask) / 144, log pi over all 9 cells as in tensorgrad;
Adam lr 5e-3; one step per rollout. `evaluate` plays greedy games against a uniformly random
opponent (tensorgrad: 60 games every 10 rollouts).

Measured with this port (and with its PyTorch twin, several seeds): win+draw against random,
half the games as X and half as O, goes from ~55% to ~75-80% within 25-50 rollouts and then
drifts between ~60% and ~85% (as X alone: ~95% at 100 rollouts); self-play ends with X winning
every game. tensorgrad reports reaching 100% "quickly"; this formulation does not get there.
"""

import numpy as np

import aot
from aot import nn, ops

K, CELLS = 16, 9
N = K * CELLS
LINES = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8], [0, 4, 8], [2, 4, 6]])


class Policy(aot.Module):
    def __init__(self, hidden=64):
        super().__init__()
        # std 1/sqrt(fan_in) for the tanh layers (the PyTorch-like scale); the output layer keeps
        # tensorgrad's default randn(0.02), so the first policy is close to uniform
        self.l1 = nn.Linear(27, hidden, init=aot.init.kaiming(1.0))
        self.l2 = nn.Linear(hidden, hidden, init=aot.init.kaiming(1.0))
        self.l3 = nn.Linear(hidden, CELLS)

    def forward(self, states):
        return self.l3(ops.tanh(self.l2(ops.tanh(self.l1(states)))))


def predict(m, states):
    return ops.softmax(m(states), -1)


def loss(m, states, actions, returns, mask):
    logp = -ops.cross_entropy(m(states), actions, reduction="none")  # log pi(a | s), [144]
    return -ops.sum(logp * returns * mask) * (1.0 / N)


program = aot.Program(
    "tic_tac_toe",
    model=Policy,
    train=aot.Train(
        loss,
        inputs={"states": aot.f32(N, 27), "actions": aot.i32(N), "returns": aot.f32(N), "mask": aot.f32(N)},
        optimizer=aot.optim.Adam(lr=5e-3),
    ),
    infer={"predict": aot.Infer(predict, inputs={"states": aot.f32("K", 27)})},
    dims={"K": (1, K)},
    seed=0,
)


# ---- the game (NumPy; boards are int8[..., 9] with 0 empty, 1 = X, -1 = O) --------------------


def encode(boards, player):
    """f32[n, 27] features of `boards` [n, 9] seen by `player` [n] (+1 or -1): empty, mine, theirs."""
    mine = boards == player[:, None]
    theirs = boards == -player[:, None]
    return np.concatenate([boards == 0, mine, theirs], 1).astype(np.float32)


def winner(boards):
    """+1 if X has a line, -1 if O has one, else 0; per board of [n, 9]."""
    sums = boards[:, LINES].sum(-1)  # [n, 8]
    return np.where((sums == 3).any(1), 1, np.where((sums == -3).any(1), -1, 0))


def rollout(policy, rng, k=K):
    """k self-play games with `policy(states f32[k, 27]) -> probs f32[k, 9]` (the model's predict);
    returns (training batch dict, outcomes for X int[k])."""
    boards = np.zeros((k, CELLS), np.int8)
    states = np.zeros((k, CELLS, 27), np.float32)
    actions = np.zeros((k, CELLS), np.int32)
    movers = np.zeros((k, CELLS), np.int8)
    mask = np.zeros((k, CELLS), np.float32)
    active = np.ones(k, bool)
    result = np.zeros(k, np.int64)
    for m in range(CELLS):
        player = np.full(k, 1 if m % 2 == 0 else -1, np.int8)
        s = encode(boards, player)
        probs = policy(s) * (boards == 0)  # illegal cells masked before sampling
        probs /= np.maximum(probs.sum(1, keepdims=True), 1e-30)
        a = (rng.random((k, 1)) > np.cumsum(probs, 1)).sum(1).clip(0, CELLS - 1)
        a = np.where(boards[np.arange(k), a] == 0, a, np.argmax(probs, 1))  # guards rounding at the top
        idx = np.flatnonzero(active)
        states[idx, m], actions[idx, m], movers[idx, m], mask[idx, m] = s[idx], a[idx], player[idx], 1.0
        boards[idx, a[idx]] = player[idx]
        w = winner(boards)
        result[active] = w[active]
        active &= (w == 0) & (boards == 0).any(1)
        if not active.any():
            break
    returns = (result[:, None] * movers * mask).astype(np.float32)  # outcome from the mover's side
    played = mask > 0
    returns[played] = (returns[played] - returns[played].mean()) / (returns[played].std() + 1e-8)
    batch = {
        "states": states.reshape(k * CELLS, 27),
        "actions": actions.reshape(-1),
        "returns": returns.reshape(-1),
        "mask": mask.reshape(-1),
    }
    return batch, result


def train(model, rng, rollouts):
    for _ in range(rollouts):
        b, _ = rollout(lambda s: model.predict(states=s), rng)
        model.step(**b)


def evaluate(policy, rng, games=60, k=K):
    """Greedy play against a uniformly random opponent, the agent X in even games and O in odd
    ones, k games in lockstep; `policy(states f32[k, 27]) -> probs f32[k, 9]`.
    Returns (wins, draws, losses) of the agent."""
    tally = np.zeros(3, np.int64)
    for first in range(0, games, k):
        n = min(k, games - first)
        agent = np.where((first + np.arange(k)) % 2 == 0, 1, -1).astype(np.int8)
        boards = np.zeros((k, CELLS), np.int8)
        active = np.arange(k) < n
        for m in range(CELLS):
            player = np.full(k, 1 if m % 2 == 0 else -1, np.int8)
            legal = boards == 0
            greedy = np.argmax(np.where(legal, policy(encode(boards, player)), -1.0), 1)
            noise = np.where(legal, rng.random((k, CELLS)), -1.0)
            move = np.where(player == agent, greedy, np.argmax(noise, 1))
            idx = np.flatnonzero(active)
            boards[idx, move[idx]] = player[idx]
            w = winner(boards)
            ended = active & ((w != 0) | ~(boards == 0).any(1))
            for g in np.flatnonzero(ended):
                tally[0 if w[g] == agent[g] else 1 if w[g] == 0 else 2] += 1
            active &= ~ended
            if not active.any():
                break
    return tuple(int(t) for t in tally)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for i in range(0, 500, 50):
            train(model, rng, 50)
            w, d, l = evaluate(lambda s: model.predict(states=s), rng)
            print(f"rollouts {i + 50}: vs random, won {w}, drew {d}, lost {l} of 60")
