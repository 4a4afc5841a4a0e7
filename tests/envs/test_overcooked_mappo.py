"""Overcooked through the ``cooperative_marl`` kind and MAPPO: config validation (one-line errors), the evaluation
env without shaped rewards, and the shaped-reward anneal's clock restored from a MAPPO checkpoint."""

import pytest

from fedarena.marl.cooperative_experiments import CooperativeConfig
from fedarena.marl.mappo import MAPPO, MAPPOConfig


def _config(**kw):
    base = dict(env_id="overcooked.cramped_room", max_cycles=400, algorithms=["mappo"], num_envs=2, env_steps=800,
                steps_per_round=800, env_options={"shaped_reward_coef": 1.0, "shaped_reward_horizon": 1000})
    return CooperativeConfig(**{**base, **kw})


def test_config_accepts_overcooked_with_mappo_only():
    cfg = _config()
    assert cfg.env_kwargs() == {"max_cycles": 400, "shaped_reward_coef": 1.0, "shaped_reward_horizon": 1000}
    with pytest.raises(ValueError, match=r"algorithms: 'overcooked.cramped_room' runs with mappo only"):
        _config(algorithms=["mappo", "qmix"])
    with pytest.raises(ValueError, match=r"env_id: unknown Overcooked layout 'overcooked.cramped'"):
        _config(env_id="overcooked.cramped")
    with pytest.raises(ValueError, match=r"env_options: shaped_reward_coef: must be >= 0"):
        _config(env_options={"shaped_reward_coef": -1.0})


def test_mappo_trains_on_shaped_rewards_evaluates_on_deliveries_and_resumes_the_anneal():
    cfg = MAPPOConfig(num_steps=50, update_epochs=1, hidden=(16,))
    m = MAPPO("overcooked.cramped_room", 2, cfg, seed=0, max_cycles=400, eval_envs=1, shaped_reward_coef=1.0,
              shaped_reward_horizon=1000)
    assert m.env.shaping_coefficient() == 1.0 and m.eval_env.shaping_coefficient() == 0.0
    m.iteration()
    assert m.env_steps == m.env.total_steps == 100 and m.env.shaping_coefficient() == pytest.approx(0.9)
    greedy = m.greedy_return(1)
    assert greedy % 20 == 0  # deliveries only
    state = m.state_dict()
    fresh = MAPPO("overcooked.cramped_room", 2, cfg, seed=0, max_cycles=400, eval_envs=1, shaped_reward_coef=1.0,
                  shaped_reward_horizon=1000)
    fresh.load_state_dict(state)
    assert fresh.env.shaping_coefficient() == pytest.approx(0.9)
    assert fresh.greedy_return(1) == greedy  # the same networks, the same evaluation starts
