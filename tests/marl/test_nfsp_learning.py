"""NFSP's learning schedule and the shipped Kuhn config (experiments/kuhn_nfsp.yaml) against the 0.10 target."""

from pathlib import Path

import numpy as np

from fedarena.envs import load_game
from fedarena.marl.nfsp import NFSP, NFSPConfig
from fedarena.platform.runs import execute

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_kuhn_config_reaches_the_target_in_half_the_budget(tmp_path):
    """Seed 0 of the shipped settings: exact exploitability of the average policy <= 0.07 after 100k of the
    config's 200k episodes, inside the issue's 0.10 (measured: 0.0343; uniform play is at 0.4583). With the
    former 200k-transition RL memory, which holds almost the whole history so the Q networks answer stale
    opponents, the same seed is at 0.103 there (``benchmarks/nfsp_sweep.py --set '{"replay_capacity": 200000}'``)."""
    summary = execute(ROOT / "experiments/kuhn_nfsp.yaml",
                      ["learner_seeds=[0]", "episodes=100000", "eval_every=100000"],
                      out=str(tmp_path / "kuhn"), quiet=True)
    assert summary["seed0/exploitability"] <= 0.07


def test_each_network_learns_once_its_own_memory_is_ready():
    """Alg. 1 of Heinrich & Silver (2016) trains the Q network from M_RL and the average network from M_SL
    separately: the Q network must not wait for the (slower-filling) reservoir, nor the average network learn
    from an empty one."""
    agent = NFSP(load_game("kuhn_poker"), NFSPConfig(num_games=32, hidden=(16,), anticipatory=0.1,
                                                      replay_capacity=5000, reservoir_capacity=5000,
                                                      min_buffer_size_to_learn=300, learn_every=8), seed=0)
    q0 = [np.copy(q["torso"]["l0"]["w"]) for q in agent.q_params]
    avg0 = [np.copy(a["torso"]["l0"]["w"]) for a in agent.avg_params]
    while min(len(r) for r in agent.replay) < 600:
        agent.train(32)
    assert max(len(r) for r in agent.reservoir) < 300                   # about a tenth of the decisions
    for p in range(2):
        assert not np.array_equal(agent.q_params[p]["torso"]["l0"]["w"], q0[p])
        np.testing.assert_array_equal(agent.avg_params[p]["torso"]["l0"]["w"], avg0[p])
    while min(len(r) for r in agent.reservoir) < 400:
        agent.train(256)
    for p in range(2):
        assert not np.array_equal(agent.avg_params[p]["torso"]["l0"]["w"], avg0[p])
