"""Vertical federated learning: PSI sample alignment, Paillier-accelerated hetero LR and split NN.

Modules: :mod:`.rsa_blind` and :mod:`.psi` (RSA-blind-signature PSI), :mod:`.paillier` and
:mod:`.packing` (accelerated and slot-packed Paillier on top of ``phe``), :mod:`.hetero_lr`
(Hardy et al. 2017 coordinated LR, and the two-party variant), :mod:`.split_nn` (split learning with an
encrypted interactive layer), :mod:`.messages` / :mod:`.channel` (wire messages and links).
Submodules are imported on use; this package imports nothing heavy.
"""
