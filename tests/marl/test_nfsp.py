"""NFSP: reservoir sampling, the stored transitions, the exact average policy, checkpoints, learning on Kuhn."""

import numpy as np
import pytest

from fedarena.envs import load_game
from fedarena.marl import exploitability
from fedarena.marl.nfsp import NFSP, NFSPConfig, ReservoirBuffer, network_policy
from fedarena.platform.checkpoint import decode_state, encode_state

SMALL = dict(num_games=64, hidden=(32,), replay_capacity=5000, reservoir_capacity=5000, min_buffer_size_to_learn=200)


def test_reservoir_keeps_a_uniform_sample_of_the_stream():
    """After a stream of 2,000 items a 100-slot reservoir holds each with probability 1/20 (Vitter 1985)."""
    counts = np.zeros(2000)
    rng = np.random.default_rng(0)
    for _ in range(300):
        r = ReservoirBuffer(100, seed=rng)
        for start in range(0, 2000, 37):  # batches of uneven size
            ids = np.arange(start, min(start + 37, 2000))
            r.add({"id": ids})
        assert len(r) == 100 and r.seen == 2000
        counts[r.data["id"]] += 1
    per_block = counts.reshape(10, 200).sum(axis=1) / (300 * 200)     # inclusion frequency per tenth of the stream
    assert np.all(np.abs(per_block - 0.05) < 4 * np.sqrt(0.05 * 0.95 / (300 * 200)))


def test_transitions_follow_each_players_own_information_states():
    game = load_game("kuhn_poker")
    agent = NFSP(game, NFSPConfig(**SMALL), seed=1)
    agent.train(3000)
    for p in range(2):
        b = agent.replay[p].gather(np.arange(len(agent.replay[p])))
        assert len(b["obs"]) > 1000
        obs, nxt, act = b["obs"], b["next_obs"], b["action"].argmax(axis=1)
        assert np.all(obs[:, p] == 1)                                   # the owner's one-hot
        moves = obs[:, 5:].reshape(-1, 3, 2).sum(axis=2).sum(axis=1).astype(int)
        live = b["not_done"] == 1
        # the next state of a non-terminal transition keeps the card and the history, plus this move
        np.testing.assert_array_equal(nxt[live, 2:5], obs[live, 2:5])
        assert np.all(nxt[live, 5 + 2 * moves[live] + act[live]] == 1)
        assert np.all(b["reward"][live] == 0)
        assert set(np.unique(b["reward"][~live])) <= {-2.0, -1.0, 1.0, 2.0}
    # the reservoir holds best-response actions only (a tenth of the episodes play it)
    assert 0 < len(agent.reservoir[0]) < 0.3 * agent.steps[0]


def test_average_policy_is_the_networks_softmax_over_legal_actions():
    game = load_game("leduc_poker")
    agent = NFSP(game, NFSPConfig(**SMALL), seed=2)
    pol = agent.average_policy()
    s = game.new_initial_state()
    for a in (0, 3, 2, 1, 4):
        s.apply_action(a)
    p = s.current_player()
    logits = np.asarray(agent.net(agent.avg_params[p], s.information_state_tensor()[None]))[0].astype(np.float64)
    legal = s.legal_actions()
    want = np.zeros(3)
    want[legal] = np.exp(logits[legal] - logits[legal].max())
    np.testing.assert_allclose(pol[s.information_state_string()], want / want.sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="reads inputs of size 30, but kuhn_poker's information_state tensor has size 11"):
        network_policy(load_game("kuhn_poker"), agent.net.__call__, agent.avg_params)


def test_checkpoint_round_trip_continues_identically():
    game = load_game("kuhn_poker")
    a = NFSP(game, NFSPConfig(**SMALL), seed=3)
    a.train(2000)
    blob = encode_state(a.state_dict())
    a.train(1500)
    b = NFSP(game, NFSPConfig(**SMALL), seed=99)
    b.load_state_dict(decode_state(blob))
    b.train(1500)
    assert a.episodes == b.episodes and a.updates == b.updates
    np.testing.assert_array_equal(a.average_policy().probs, b.average_policy().probs)


def test_nfsp_learns_on_kuhn():
    """Exact exploitability of the average policy falls well below uniform play's 0.4583 in 30k episodes."""
    game = load_game("kuhn_poker")
    agent = NFSP(game, NFSPConfig(num_games=128), seed=0)
    agent.train(30_000)
    assert agent.updates > 1000
    assert exploitability(game, agent.average_policy()) < 0.33


def test_bad_config_is_one_line():
    with pytest.raises(ValueError, match="nfsp.anticipatory"):
        NFSPConfig(anticipatory=1.5)
    with pytest.raises(ValueError, match="nfsp.optimizer"):
        NFSPConfig(optimizer="lion")
