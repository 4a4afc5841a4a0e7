"""Model robustness on the engine: evasion attacks (FGSM, PGD, Carlini-Wagner L2), PGD adversarial training, the
feature-squeezing detector and robustness evaluation."""
