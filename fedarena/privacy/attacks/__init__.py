"""Privacy attacks that measure what the defences buy: membership inference (loss threshold, shadow models) and
gradient inversion (DLG / iDLG) against engine models and FL updates."""
