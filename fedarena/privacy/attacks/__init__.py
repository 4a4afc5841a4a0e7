"""Privacy attacks that measure what the defences buy: membership inference against engine models."""
