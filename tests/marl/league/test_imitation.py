"""Imitation: expert datasets carry the expert's moves and distributions; a behaviour-cloned tic-tac-toe agent picks a
minimax-optimal move on positions it never saw in training."""

from __future__ import annotations

import numpy as np
import pytest

from fedarena import engine
from fedarena.marl.league.agent import AgentConfig, BoardAgent
from fedarena.marl.league.imitation import behaviour_clone, expert_dataset
from fedarena.marl.league.players import minimax_player, one_ply_player, tictactoe_codes, tictactoe_solution


@pytest.fixture(autouse=True)
def one_engine_thread():
    """Small batches: the engine's thread pool only adds synchronisation (slow on a loaded machine)."""
    before = engine.get_num_threads()
    engine.set_num_threads(1)
    yield
    engine.set_num_threads(before)


def test_expert_dataset_rows_are_the_experts() -> None:
    ds = expert_dataset("connect_four", one_ply_player(), 20, seed=0, explore=0.5, num_envs=8)
    assert ds["mask"][np.arange(len(ds["action"])), ds["action"]].all()
    np.testing.assert_allclose(ds["target"], one_ply_player().probs(ds["obs"], ds["mask"]), rtol=1e-6)
    assert (ds["target"][np.arange(len(ds["action"])), ds["action"]] > 0).all()
    assert set(np.unique(ds["result"])) <= {-1.0, 0.0, 1.0}
    with pytest.raises(ValueError, match="explore"):
        expert_dataset("tictactoe", minimax_player(), 2, seed=0, explore=2.0)


def test_cloned_agent_matches_minimax_optimal_moves_on_held_out_positions() -> None:
    sol = tictactoe_solution()
    ds = expert_dataset("tictactoe", minimax_player(), 1000, seed=0, explore=0.7)
    codes = tictactoe_codes(ds["obs"])
    uniq, first = np.unique(codes, return_index=True)
    rng = np.random.default_rng(0)
    held = rng.random(len(uniq)) < 0.2
    train = {k: v[first[~held]] for k, v in ds.items()}  # one row per training position
    test_rows = first[held]
    agent = BoardAgent((3, 3, 2), 9, AgentConfig(hidden=(128, 128)))
    params0 = agent.init_params(0)

    def optimal_share(p: dict) -> float:
        logits, _ = agent.policy(p, ds["obs"][test_rows], ds["mask"][test_rows])
        return float(sol.optimal[codes[test_rows], logits.argmax(1)].mean())

    params, metrics = behaviour_clone(agent, params0, train, epochs=12, lr=3e-3, seed=0, batch_size=128)
    assert len(test_rows) > 400 and not set(codes[test_rows]) & set(codes[first[~held]])
    assert metrics["accuracy"] > 0.95  # on the training positions
    before, after = optimal_share(params0), optimal_share(params)
    assert after >= 0.9 and after > before + 0.3, (before, after)
