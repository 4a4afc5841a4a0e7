"""Model robustness on the engine: evasion attacks (FGSM, PGD), adversarial training and robustness evaluation."""
