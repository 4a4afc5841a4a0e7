"""Federated data sets read from local files at scale: readers of the formats researchers keep on disk (TFF's
HDF5 client data, LEAF JSON, CIFAR binary), a per-user index built once, and the per-client pipeline that reads,
maps and prefetches a round's clients (:mod:`~fedarena.federated.datasets.pipeline`, after the seed's MindData
chapter), with a manifest of the files each run used. No file is downloaded: ``data.path`` points at files
already on disk. The in-memory data sets and partitioners stay in :mod:`fedarena.federated.data`.
"""

from fedarena.federated.datasets.pipeline import PIPELINE_DATASETS, ClientSource, Examples, StreamedData, load

__all__ = ["PIPELINE_DATASETS", "ClientSource", "Examples", "StreamedData", "load"]
