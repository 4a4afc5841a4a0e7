"""fedarena.privacy: protecting client updates and training data.

Modules (import the one you need; nothing is imported eagerly):
``ldp`` (clipping, analytic Gaussian and Laplace mechanisms), ``signds`` (SignDS / EM-MDS),
``secagg`` (SecAgg and SecAgg+ secure aggregation), ``accountant`` (RDP of the sampled Gaussian mechanism),
``budget`` (privacy-budget monitor), ``dpsgd`` (DP-SGD for engine models) and ``dpsgd_experiment``
(experiment kind ``dpsgd_digits``). See docs/architecture.md, section Privacy.
"""
