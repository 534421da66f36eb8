"""tensorgrad's cartpole sample: REINFORCE on the classic cart-pole, environment in NumPy.

Policy: Linear(4, 16) -> tanh -> Linear(16, 2) (114 params); `predict` returns the action
probabilities softmax(logits) for K = 16 states at once. A rollout steps K = 16 environments in
lockstep for at most MAX_T = 200 steps, one `predict` call per time step on the GPU, actions
sampled on the host. Gym's constants: gravity 9.8, cart mass 1.0, pole mass 0.1, half-length
0.5, force 10, tau 0.02 (explicit Euler); an episode ends when |x| > 2.4 or |theta| > 12 degrees.
Discounted returns (gamma 0.99) are normalized (mean/std) over the slots actually played.

Training input: one rollout flattened to 16 x 200 = 3200 slots (slot k * 200 + t is environment
k at time t): states f32[3200, 4], actions i32[3200], returns f32[3200], mask f32[3200].
Loss = -sum(log pi(a | s) * R * mask) / (200 * 16); Adam lr 5e-3; one step per rollout.
"""

import math

import numpy as np

import aot
from aot import nn, ops

K, MAX_T, GAMMA = 16, 200, 0.99
N = K * MAX_T

GRAVITY, CART_MASS, POLE_MASS, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * math.pi / 360


class Policy(aot.Module):
    def __init__(self):
        super().__init__()
        # std 1/sqrt(fan_in) for the tanh layer (the PyTorch-like scale); the output layer keeps
        # tensorgrad's default randn(0.02), so the first policy is close to uniform
        self.l1 = nn.Linear(4, 16, init=aot.init.kaiming(1.0))
        self.l2 = nn.Linear(16, 2)

    def forward(self, states):
        return self.l2(ops.tanh(self.l1(states)))


def predict(m, states):
    return ops.softmax(m(states), -1)


def loss(m, states, actions, returns, mask):
    logp = -ops.cross_entropy(m(states), actions, reduction="none")  # log pi(a | s), [3200]
    return -ops.sum(logp * returns * mask) * (1.0 / N)


program = aot.Program(
    "cartpole",
    model=Policy,
    train=aot.Train(
        loss,
        inputs={"states": aot.f32(N, 4), "actions": aot.i32(N), "returns": aot.f32(N), "mask": aot.f32(N)},
        optimizer=aot.optim.Adam(lr=5e-3),
    ),
    infer={"predict": aot.Infer(predict, inputs={"states": aot.f32("K", 4)})},
    dims={"K": (1, K)},
    seed=0,
)


# ---- the environment (NumPy, vectorized over environments) -----------------------------------


def reset(rng, k=K):
    """Initial states f32[k, 4] (x, x_dot, theta, theta_dot), each uniform in [-0.05, 0.05]."""
    return rng.uniform(-0.05, 0.05, (k, 4)).astype(np.float32)


def env_step(states, actions):
    """One Euler step of gym's CartPole-v1 dynamics; returns (next states, done mask)."""
    s = states.astype(np.float64)
    x, x_dot, theta, theta_dot = s.T
    force = np.where(actions == 1, FORCE, -FORCE)
    total = CART_MASS + POLE_MASS
    pml = POLE_MASS * HALF_LENGTH
    cos, sin = np.cos(theta), np.sin(theta)
    temp = (force + pml * theta_dot**2 * sin) / total
    theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * cos**2 / total))
    x_acc = temp - pml * theta_acc * cos / total
    nxt = np.stack([x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot, theta_dot + TAU * theta_acc], 1)
    done = (np.abs(nxt[:, 0]) > X_LIMIT) | (np.abs(nxt[:, 2]) > THETA_LIMIT)
    return nxt.astype(np.float32), done


def discounted_returns(rewards, gamma=GAMMA):
    """G_t = sum_i gamma^i r_{t+i} along the last axis."""
    out = np.zeros_like(rewards)
    acc = np.zeros(rewards.shape[:-1], rewards.dtype)
    for t in range(rewards.shape[-1] - 1, -1, -1):
        acc = rewards[..., t] + gamma * acc
        out[..., t] = acc
    return out


def rollout(policy, rng, k=K, max_t=MAX_T):
    """Run k episodes in lockstep with `policy(states f32[k, 4]) -> probs f32[k, 2]` (the model's
    predict); returns (training batch dict, episode lengths int[k])."""
    states = np.zeros((k, max_t, 4), np.float32)
    actions = np.zeros((k, max_t), np.int32)
    rewards = np.zeros((k, max_t), np.float32)
    alive = np.ones(k, bool)
    lengths = np.zeros(k, np.int64)
    s = reset(rng, k)
    for t in range(max_t):
        probs = policy(s)
        a = (rng.random(k) < probs[:, 1]).astype(np.int32)
        states[alive, t], actions[alive, t], rewards[alive, t] = s[alive], a[alive], 1.0
        lengths += alive
        s, done = env_step(s, a)
        alive &= ~done
        if not alive.any():
            break
    mask = (np.arange(max_t) < lengths[:, None]).astype(np.float32)
    ret = discounted_returns(rewards) * mask
    played = mask > 0
    ret[played] = (ret[played] - ret[played].mean()) / (ret[played].std() + 1e-8)
    batch = {
        "states": states.reshape(k * max_t, 4),
        "actions": actions.reshape(-1),
        "returns": ret.reshape(-1).astype(np.float32),
        "mask": mask.reshape(-1),
    }
    return batch, lengths


def train(model, rng, rollouts):
    """`rollouts` REINFORCE updates; returns the mean episode length of each rollout."""
    means = []
    for _ in range(rollouts):
        b, lengths = rollout(lambda s: model.predict(states=s), rng)
        model.step(**b)
        means.append(float(lengths.mean()))
    return means


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for i in range(0, 300, 20):
            means = train(model, rng, 20)
            print(f"rollouts {i + 1}-{i + 20}: mean episode length {np.mean(means):.1f}")
