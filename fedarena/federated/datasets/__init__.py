"""Federated data sets read from local files at scale: readers of the formats researchers keep on disk (TFF's
HDF5 client data, LEAF JSON, CIFAR binary), a per-user index built once, and the per-client pipeline that reads,
maps and prefetches a round's clients (:mod:`~fedarena.federated.datasets.pipeline`, after the seed's MindData
chapter), with a manifest of the files each run used. No file is downloaded: ``data.path`` points at files
already on disk. The in-memory data sets and partitioners stay in :mod:`fedarena.federated.data`.
"""

from fedarena.federated.datasets.pipeline import PIPELINE_DATASETS, ClientSource, Examples, StreamedData, load

__all__ = ["PIPELINE_DATASETS", "ClientSource", "Examples", "StreamedData", "load", "token_accuracy_masks"]


def token_accuracy_masks(dataset: str, num_classes: int) -> dict[str, tuple[int, ...]]:
    """The every-token test accuracies of a language-model data set: ``{metric name: target ids left out}``
    (empty for other data sets), the rules of TFF's code for Reddi et al. 2021 (google-research/federated,
    ``optimization/tasks/shakespeare.py`` and ``stackoverflow_nwp.py``, whose masked accuracy leaves these
    targets out of both the hits and the count):

    * ``tff_shakespeare``, ``leaf_shakespeare``: ``test_token_acc`` leaves out the pad id 0 only (the out-of-
      vocabulary and end ids count; the beginning id is never a target);
    * ``tff_stackoverflow_nwp``: ``test_token_acc`` leaves out pad, out-of-vocabulary and end of sentence (TFF's
      ``accuracy_no_oov_or_eos``), ``test_token_acc_with_oov_eos`` the pad only (TFF's ``accuracy_with_oov``).

    The special ids are the Stack Overflow reader's (:mod:`~fedarena.federated.datasets.stackoverflow`):
    out-of-vocabulary, beginning and end are the last three of its ``num_classes`` ids."""
    if dataset in ("tff_shakespeare", "leaf_shakespeare"):
        return {"test_token_acc": (0,)}
    if dataset == "tff_stackoverflow_nwp":
        oov, eos = num_classes - 3, num_classes - 1
        return {"test_token_acc": (0, oov, eos), "test_token_acc_with_oov_eos": (0,)}
    return {}
