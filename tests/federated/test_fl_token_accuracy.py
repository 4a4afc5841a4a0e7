"""Every-token accuracy of the language models (:meth:`fedarena.federated.models.BatchedZooModel.token_accuracies`),
the metric of Reddi et al. 2021's Shakespeare and Stack Overflow NWP rows: checked against a brute-force count
over PyTorch twins' logits (one position at a time, the masked targets skipped), against a closed form (a model
that always predicts one id), for its bounded chunks, and for the masks of each data set (the readers' special
ids)."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fedarena.federated import models as fm  # noqa: E402
from fedarena.federated import simulation as sim  # noqa: E402
from fedarena.federated import strategy as st  # noqa: E402
from fedarena.federated.datasets import stackoverflow, tff, token_accuracy_masks  # noqa: E402
from fedarena.federated.models import BatchedZooModel  # noqa: E402

_TWINS = pathlib.Path(__file__).parents[1] / "engine" / "torch_twins.py"
_spec = importlib.util.spec_from_file_location("torch_twins", _TWINS)
twins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(twins)

LMS = {"char_lstm": dict(embed_dim=3, hidden=5), "word_lstm": dict(embed_dim=4, hidden=6)}


def _sequences(n: int, features: int, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """Left-aligned sequences padded at the end (as the readers emit them), lengths 1..features."""
    x = rng.integers(1, vocab, (n, features))
    for i, length in enumerate(rng.integers(1, features + 1, n)):
        x[i, length:] = 0
    return x


def _scaled_params(model: BatchedZooModel, seed: int) -> dict:
    """Initial parameters times 4, so that the predicted id varies along a sequence."""
    return {k: 4.0 * v for k, v in model.init_params(seed).items()}


def _brute_force(model: BatchedZooModel, params: dict, x: np.ndarray, left_out: set[int]) -> tuple[int, int, int]:
    """(hits, counted, near ties): PyTorch float64 logits of each sequence alone, every position visited."""
    twin = twins.TorchRecurrentLM(model.module).double()
    with torch.no_grad():
        twin.load(model._tree(params), np.float64)
    hits = counted = ties = 0
    for seq in x:
        with torch.no_grad():
            logits = twin(torch.tensor(seq[None, :-1].astype(np.int64)))[0].numpy()
        for t in range(len(seq) - 1):
            target = int(seq[t + 1])
            if target in left_out:
                continue
            counted += 1
            top2 = np.sort(logits[t])[-2:]
            ties += int(top2[1] - top2[0] < 1e-4)
            hits += int(int(np.argmax(logits[t])) == target)
    return hits, counted, ties


@pytest.mark.parametrize("arch", list(LMS))
def test_every_token_accuracy_equals_a_brute_force_count(arch, monkeypatch):
    features, vocab = 9, 8
    oov, eos = vocab - 3, vocab - 1
    model = BatchedZooModel(arch, features, vocab, **LMS[arch])
    rng = np.random.default_rng(3)
    x = _sequences(23, features, vocab, rng)
    params = _scaled_params(model, 4)
    # small chunks (4 sequences) and reads (10 sequences): several of each, the last ones short
    monkeypatch.setattr(fm, "EVAL_TOKEN_LOGITS", 4 * (features - 1) * vocab)
    monkeypatch.setattr(fm, "EVAL_READ", 10)
    masks = {"pad": (0,), "pad_oov_eos": (0, oov, eos)}
    got = model.token_accuracies(params, x.astype(np.float32), masks)
    for name, left_out in masks.items():
        hits, counted, ties = _brute_force(model, params, x, set(left_out))
        assert ties == 0, (name, ties)
        assert counted > 0
        assert got[name] == pytest.approx(hits / counted, abs=1e-12), name
    # the two masks count different positions, and the model is neither always right nor always wrong
    assert got["pad"] != got["pad_oov_eos"]
    assert 0.0 < got["pad"] < 1.0


def test_a_model_that_always_predicts_one_id_scores_its_share_of_the_targets():
    """Closed form: with a large output bias on id k every prediction is k, so the accuracy is the share of the
    counted targets equal to k (0 when k is left out)."""
    features, vocab, k = 7, 6, 2
    model = BatchedZooModel("char_lstm", features, vocab, embed_dim=2, hidden=3)
    params = model.init_params(0)
    name = next(n for n in params if n.startswith("out.") and params[n].ndim == 1)
    params[name] = np.where(np.arange(vocab) == k, 1e3, 0.0).astype(np.float32)
    x = _sequences(17, features, vocab, np.random.default_rng(1))
    target = x[:, 1:]
    got = model.token_accuracies(params, x.astype(np.float32), {"a": (0,), "b": (0, k), "c": (0, 1, 3, 4, 5)})
    assert got["a"] == pytest.approx(np.sum(target == k) / np.sum(target != 0))
    assert got["b"] == 0.0
    assert got["c"] == 1.0
    assert np.isnan(model.token_accuracies(params, np.zeros((3, features), np.float32), {"a": (0,)})["a"])


def test_predictions_run_in_bounded_chunks(monkeypatch):
    """At most EVAL_TOKEN_LOGITS logits a call (a power of two of sequences), equal to the unchunked predictions."""
    features, vocab = 6, 5
    model = BatchedZooModel("char_lstm", features, vocab, embed_dim=2, hidden=3)
    params = _scaled_params(model, 2)
    x = _sequences(11, features, vocab, np.random.default_rng(2)).astype(np.float32)
    whole = model.token_predictions(params, x)
    seen = []
    program = model._predict
    monkeypatch.setattr(model, "_predict", lambda tree, rows: (seen.append(len(rows)), program(tree, rows))[1])
    monkeypatch.setattr(fm, "EVAL_TOKEN_LOGITS", 4 * (features - 1) * vocab + 7)
    np.testing.assert_array_equal(model.token_predictions(params, x), whole)
    assert seen == [4, 4, 4]  # 11 sequences: 4 + 4 + 3 padded to 4
    full = np.asarray(model.module.apply(model._tree(params), x[:, :-1].astype(np.int32))).argmax(-1)
    np.testing.assert_array_equal(whole, full)
    with pytest.raises(ValueError, match="model.arch"):
        BatchedZooModel("cnn_emnist", 100, 3, widths=(2, 2), hidden=4).token_predictions({}, x)


def test_masks_of_each_data_set_follow_the_readers_special_ids():
    vocab = stackoverflow.Vocab(["the", "a", "is"], None)
    classes = vocab.size + 4  # the reader's num_classes for next-word prediction
    assert token_accuracy_masks("tff_stackoverflow_nwp", classes) == {
        "test_token_acc": (0, vocab.oov, vocab.eos), "test_token_acc_with_oov_eos": (0,)}
    assert token_accuracy_masks("tff_stackoverflow_nwp", 10_004)["test_token_acc"] == (0, 10_001, 10_003)
    assert tff.EOS + 1 == 90 and token_accuracy_masks("tff_shakespeare", 90) == {"test_token_acc": (0,)}
    assert token_accuracy_masks("leaf_shakespeare", 81) == {"test_token_acc": (0,)}
    assert token_accuracy_masks("tff_emnist", 62) == {}


def test_simulation_reports_every_token_accuracy_at_evaluation():
    features, vocab = 7, 6
    model = BatchedZooModel("char_lstm", features, vocab, embed_dim=2, hidden=3)
    rng = np.random.default_rng(0)
    x = _sequences(12, features, vocab, rng).astype(np.float32)
    test = _sequences(9, features, vocab, rng).astype(np.float32)
    masks = {"test_token_acc": (0,)}
    s = sim.Simulation(model, st.FedAvg(st.FitConfig(epochs=1, batch_size=3, lr=0.5), clients_per_round=2), x,
                       x[:, -1].astype(np.int64), [np.arange(6), np.arange(6, 12)], ["c0", "c1"], vocab, seed=1,
                       test=(test, test[:, -1].astype(np.int64)), eval_clients=False, token_masks=masks)
    state, rec = s.round(s.init_state(model.init_params(1)))
    assert rec.metrics["test_token_acc"] == model.token_accuracies(state.params, test, masks)["test_token_acc"]
    assert "test_acc" in rec.metrics  # the last-token accuracy stays
