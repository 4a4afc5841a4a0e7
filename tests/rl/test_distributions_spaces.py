"""Action distributions against torch.distributions; space adapters on concrete gymnasium spaces."""

import numpy as np
import pytest
from gymnasium import spaces
from scipy import stats

from fedarena.rl.distributions import Categorical, DiagGaussian, MultiCategorical
from fedarena.rl.spaces import action_distribution, env_action, observation_adapter

torch = pytest.importorskip("torch")


def test_categorical_log_prob_entropy_and_sampling():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    d = Categorical(4)
    actions = rng.integers(4, size=6)
    ref = torch.distributions.Categorical(logits=torch.tensor(logits))
    np.testing.assert_allclose(d.log_prob(logits, d.encode(actions)), ref.log_prob(torch.tensor(actions)).numpy(), rtol=1e-5)
    np.testing.assert_allclose(d.log_prob_np(logits, actions), ref.log_prob(torch.tensor(actions)).numpy(), rtol=1e-5)
    np.testing.assert_allclose(d.entropy(logits), ref.entropy().numpy(), rtol=1e-5)
    row = np.tile(logits[:1], (20000, 1))
    counts = np.bincount(d.sample(row, rng), minlength=4)
    p = torch.softmax(torch.tensor(logits[0]), -1).numpy().astype(np.float64)
    assert stats.chisquare(counts, 20000 * p / p.sum()).pvalue > 1e-3


def test_multicategorical_matches_product_of_categoricals():
    rng = np.random.default_rng(1)
    d = MultiCategorical((3, 2, 5))
    logits = rng.normal(size=(7, 10)).astype(np.float32) * 3
    actions = d.sample(logits, rng)
    assert actions.shape == (7, 3)
    parts = [torch.distributions.Categorical(logits=torch.tensor(logits[:, a:b])) for a, b in ((0, 3), (3, 5), (5, 10))]
    ref_lp = sum(p.log_prob(torch.tensor(actions[:, i])) for i, p in enumerate(parts)).numpy()
    ref_ent = sum(p.entropy() for p in parts).numpy()
    np.testing.assert_allclose(d.log_prob(logits, d.encode(actions)), ref_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d.log_prob_np(logits, actions), ref_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d.entropy(logits), ref_ent, rtol=1e-5, atol=1e-5)


@pytest.mark.quick
@pytest.mark.parametrize("squash", [False, True])
def test_gaussian_log_prob_against_torch(squash):
    rng = np.random.default_rng(2)
    low, high = np.array([-2.0, 0.0, -1.0]), np.array([2.0, 1.0, 3.0])
    d = DiagGaussian(3, tuple(low), tuple(high), squash=squash)
    mean = rng.normal(size=(5, 3)).astype(np.float32)
    log_std = rng.normal(scale=0.3, size=3).astype(np.float32)
    raw = d.sample(mean, log_std, rng).astype(np.float32)
    base = torch.distributions.Independent(torch.distributions.Normal(torch.tensor(mean), torch.tensor(np.exp(log_std))), 1)
    if squash:
        t = [torch.distributions.transforms.TanhTransform(),
             torch.distributions.transforms.AffineTransform(torch.tensor((low + high) / 2), torch.tensor((high - low) / 2))]
        ref = torch.distributions.TransformedDistribution(base, t)
        a = torch.tensor(d.to_env(raw), dtype=torch.float64)
        ref_lp = ref.log_prob(a.float()).double().numpy()
        np.testing.assert_allclose(d.to_env(raw), np.tanh(raw) * (high - low) / 2 + (low + high) / 2, rtol=1e-5)
        tol = 2e-3  # torch inverts tanh from the float32 action; we keep u exactly
    else:
        ref_lp = base.log_prob(torch.tensor(raw)).numpy()
        tol = 1e-5
        assert np.all(d.to_env(raw * 10) <= high) and np.all(d.to_env(raw * 10) >= low)
    np.testing.assert_allclose(d.log_prob(mean, log_std, raw), ref_lp, rtol=tol, atol=tol)
    np.testing.assert_allclose(d.log_prob_np(mean, log_std, raw), ref_lp, rtol=tol, atol=tol)
    np.testing.assert_allclose(d.entropy(mean, log_std), base.entropy().numpy(), rtol=1e-5)


def test_observation_adapters():
    dict_space = spaces.Dict({"b": spaces.Box(-1, 1, (2,)), "a": spaces.Discrete(3),
                              "c": spaces.MultiDiscrete([2, 3])})
    ad = observation_adapter(dict_space)
    assert ad.torso == "mlp" and ad.shape == (2 + 3 + 5,)
    obs = {"a": np.array([2, 0]), "b": np.array([[0.5, -0.5], [1.0, 0.0]]), "c": np.array([[1, 2], [0, 0]])}
    x = ad(obs)
    np.testing.assert_array_equal(x[0], [0, 0, 1, 0.5, -0.5, 0, 1, 0, 0, 1])  # keys in sorted order a, b, c
    np.testing.assert_array_equal(x[1], [1, 0, 0, 1.0, 0.0, 1, 0, 1, 0, 0])
    img = observation_adapter(spaces.Box(0, 255, (84, 84, 4), dtype=np.uint8))
    assert img.torso == "cnn" and img.shape == (4, 84, 84)
    batch = np.full((2, 84, 84, 4), 255, dtype=np.uint8)
    out = img(batch)
    assert out.shape == (2, 4, 84, 84) and out.dtype == np.float32 and out.max() == 1.0
    vec = observation_adapter(spaces.Box(-1, 1, (3, 2)))
    assert vec.shape == (6,) and vec(np.zeros((5, 3, 2))).shape == (5, 6)


def test_action_distributions_for_spaces():
    assert action_distribution(spaces.Discrete(4)) == Categorical(4)
    assert action_distribution(spaces.MultiDiscrete([2, 5])) == MultiCategorical((2, 5))
    g = action_distribution(spaces.Box(-2, 2, (2,)), squash=True)
    assert isinstance(g, DiagGaussian) and g.squash and g.low == (-2.0, -2.0)
    assert env_action(g, np.array([[100.0, -100.0]])).tolist() == [[2.0, -2.0]]
    with pytest.raises(ValueError, match="finite"):
        action_distribution(spaces.Box(-np.inf, np.inf, (2,)), squash=True)
    with pytest.raises(TypeError, match="action_space"):
        action_distribution(spaces.Text(5))
    with pytest.raises(ValueError, match="start"):
        action_distribution(spaces.Discrete(3, start=1))


def test_cnn_torso_matches_torch_convolutions():
    from fedarena.rl.networks import ActorCritic, torso_for

    space = spaces.Box(0, 255, (36, 36, 4), dtype=np.uint8)
    adapter = observation_adapter(space)
    net = ActorCritic(torso_for(adapter, (32,)), Categorical(3))
    params = net.init(np.random.default_rng(0))
    obs = np.random.default_rng(1).integers(0, 256, size=(2, 36, 36, 4)).astype(np.uint8)
    x = adapter(obs)
    (logits,) = net.policy(params, x)
    p = params["pi"]["torso"]
    h = torch.tensor(x)
    for i, s in enumerate((4, 2, 1)):
        h = torch.relu(torch.nn.functional.conv2d(h, torch.tensor(p[f"c{i}"]["w"]), stride=s)
                       + torch.tensor(p[f"c{i}"]["b"]))
    h = torch.relu(h.reshape(2, -1) @ torch.tensor(p["fc"]["w"]) + torch.tensor(p["fc"]["b"]))
    ref = h @ torch.tensor(params["pi"]["head"]["w"]) + torch.tensor(params["pi"]["head"]["b"])
    np.testing.assert_allclose(np.asarray(logits), ref.numpy(), rtol=1e-4, atol=1e-5)
