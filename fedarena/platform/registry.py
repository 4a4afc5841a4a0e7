"""Registry of experiment kinds: name -> lazily imported :class:`~fedarena.platform.experiment.Experiment`.

Kinds are listed here by import path, so ``fedarena list`` and ``import fedarena.platform`` import no
higher layer; the module behind a kind is imported only when that kind is run or shown.
To add a kind, add one line to ``KINDS``: ``name: (\"module:attribute\", \"one-line description\")``.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

from fedarena.platform.experiment import Experiment

KINDS: dict[str, tuple[str, str]] = {
    "ppo": ("fedarena.rl.experiments:PPO_EXPERIMENT", "PPO (clipped objective, GAE) on a gymnasium env; local, multiprocess or Ray actors"),
    "dqn": ("fedarena.rl.experiments:DQN_EXPERIMENT", "DQN with double/dueling/n-step/prioritized replay on a gymnasium env"),
    "impala": ("fedarena.rl.experiments:IMPALA_EXPERIMENT", "IMPALA (V-trace) with asynchronous actors, optionally on Ray with an inference server"),
    "xfp": ("fedarena.marl.game_experiments:XFP_EXPERIMENT", "full-width extensive-form fictitious play (XFP) on Kuhn/Leduc/matrix games, exact exploitability per iteration"),
    "cfr": ("fedarena.marl.game_experiments:CFR_EXPERIMENT", "CFR / CFR+ reference equilibrium solver on Kuhn/Leduc/matrix games, exact exploitability of the average policy"),
    "mccfr": ("fedarena.marl.mccfr_experiment:EXPERIMENT", "external- or outcome-sampling MCCFR (batched on the compiled tree, or lazy on large games): exact exploitability vs iterations, histories touched and time; exports policy.json"),
    "deep_cfr": ("fedarena.marl.deep_cfr_experiment:EXPERIMENT", "Single Deep CFR (mixture of every iteration's advantage networks) or Deep CFR (average-strategy network) on the engine: exact exploitability vs iterations, histories touched and time; exports policy.json"),
    "psro": ("fedarena.marl.game_experiments:PSRO_EXPERIMENT", "PSRO with exact best responses, several meta-solvers (nash, prd, uniform, last...) compared in one report"),
    "nfsp": ("fedarena.marl.learning_experiments:NFSP_EXPERIMENT", "NFSP (DQN best response + reservoir-trained average policy), batched self-play on Kuhn/Leduc, exact exploitability over seeds"),
    "psro_rl": ("fedarena.marl.learning_experiments:PSRO_RL_EXPERIMENT", "PSRO with a DQN or PPO best-response oracle, exact exploitability per iteration beside exact-oracle PSRO"),
    "matrix_dynamics": (
        "fedarena.marl.matrix_dynamics:EXPERIMENT",
        "self-play (iterated best response) and fictitious play side by side on a two-player matrix game",
    ),
    "cooperative_marl": ("fedarena.marl.cooperative_experiments:EXPERIMENT", "QMIX, VDN, independent PPO and MAPPO side by side on a cooperative PettingZoo task (vectorised MPE, the QMIX two-step game), several seeds"),
    "league": ("fedarena.marl.league.experiment:EXPERIMENT", "AlphaStar-style league (main agents, main/league exploiters, PFSP, snapshot store, payoff table, Elo/TrueSkill) on tic-tac-toe, connect four or rps_v2; in-process or on Ray"),
    "selfplay_ppo": ("fedarena.marl.selfplay_experiments:EXPERIMENT", "masked PPO self-play with a pool of past snapshots on a turn-based PettingZoo game (tic-tac-toe), win rates vs random and vs the initial policy"),
    "dpsgd_digits": ("fedarena.privacy.dpsgd_experiment:EXPERIMENT", "DP-SGD on sklearn digits with an engine MLP, RDP accountant and a budget monitor that stops at the epsilon budget"),
    "digits_robustness": ("fedarena.robustness.experiment:EXPERIMENT", "FGSM/PGD/CW robustness of a digits MLP with and without PGD adversarial training (Madry et al. 2018): accuracy vs epsilon; feature-squeezing detection"),
    "dpsgd_membership": ("fedarena.privacy.attacks.membership_experiment:EXPERIMENT", "loss-threshold and shadow-model membership inference (Yeom et al. 2018; Shokri et al. 2017) against DP-SGD digits models: AUC and advantage vs epsilon beside the DP bound"),
    "fl_gradient_inversion": ("fedarena.privacy.attacks.inversion_experiment:EXPERIMENT", "DLG + iDLG gradient inversion of one FedAvg update of a digits client: plain vs LDP vs SignDS vs SecAgg, image grid and MSE table"),
    "fedsim": ("fedarena.federated.fedsim_experiment:EXPERIMENT", "federated simulation of many clients in one process (vmapped local training) or on Ray: partitioners, strategies, heterogeneity, compression, DP-FedAvg, SecAgg, per-client evaluation"),
    "fedavg_table": ("fedarena.federated.reproductions:FEDAVG_TABLE", "McMahan et al. 2017 Table 2 layout: FedAvg rounds to a target accuracy over C, E, B, IID vs pathological non-IID, with curves and the table"),
    "fedsim_sweep": ("fedarena.federated.reproductions:FEDSIM_SWEEP", "variants of one fedsim config side by side: accuracy against uploaded bytes (compression) or the accountant's epsilon (DP-FedAvg, LDP, SignDS), with a table"),
    "fedprox_figure": ("fedarena.federated.reproductions:FEDPROX_FIGURE", "Li et al. 2020 Figure 1 layout: training loss on Synthetic(a,b) with 0/50/90% stragglers, FedAvg vs FedProx mu=0 vs mu>0 over seeds"),
    "fedavg_grpc": ("fedarena.federated.grpc_experiment:EXPERIMENT", "horizontal FL over real gRPC on loopback: scheduler, servers and client processes, time-limited FedAvg rounds"),
    "vfl_lr": ("fedarena.federated.vertical.experiment:LR_EXPERIMENT", "vertical FL on breast cancer: RSA-blind-signature PSI, then Paillier hetero LR (coordinator or two-party), AUC vs centralized"),
    "vfl_splitnn": ("fedarena.federated.vertical.experiment:SPLITNN_EXPERIMENT", "vertical FL on digits: PSI, then a split NN with a Paillier-encrypted interactive layer and joint inference"),
}


@dataclass(frozen=True)
class KindInfo:
    name: str
    target: str
    description: str


class UnknownKindError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


def list_kinds() -> list[KindInfo]:
    return [KindInfo(name, target, desc) for name, (target, desc) in sorted(KINDS.items())]


def get_kind(name: str) -> Experiment:
    """Import and return the experiment registered as ``name``."""
    if name not in KINDS:
        close = difflib.get_close_matches(name, KINDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f"; known kinds: {', '.join(sorted(KINDS))}"
        raise UnknownKindError(f"kind: unknown experiment kind '{name}'{hint}")
    module_name, attr = KINDS[name][0].split(":")
    experiment = getattr(importlib.import_module(module_name), attr)
    if not isinstance(experiment, Experiment):
        raise TypeError(f"{KINDS[name][0]} is not a fedarena.platform.experiment.Experiment")
    return experiment
