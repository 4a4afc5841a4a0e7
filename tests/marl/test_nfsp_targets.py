"""The supervised memory of NFSP holds the epsilon-greedy best response's action distribution."""

import numpy as np

from fedarena.envs import load_game
from fedarena.marl.nfsp import NFSP, NFSPConfig


def test_reservoir_targets_are_the_epsilon_greedy_distribution_of_the_q_network():
    game = load_game("kuhn_poker")
    agent = NFSP(game, NFSPConfig(num_games=16, hidden=(8,), anticipatory=1.0, epsilon_start=0.3, epsilon_end=0.3,
                                  min_buffer_size_to_learn=10**9), seed=0)
    agent.train(40)
    mem = agent.reservoir[0]
    batch = mem.sample(min(len(mem), 64))
    probs, legal = batch["action"], batch["legal"]
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    assert np.all(probs[~legal] == 0)
    # every legal action has eps/|legal|, the greedy one 1 - eps more (Kuhn: 2 legal actions everywhere)
    q = np.asarray(agent._act(agent.q_params, agent.avg_params, batch["obs"])[0][0])
    greedy = np.argmax(np.where(legal, q, -np.inf), axis=1)
    expect = np.where(legal, 0.3 / legal.sum(axis=1, keepdims=True), 0.0)
    expect[np.arange(len(q)), greedy] += 0.7
    np.testing.assert_allclose(probs, expect, atol=1e-6)
