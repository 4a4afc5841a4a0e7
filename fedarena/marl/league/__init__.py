"""League training (Vinyals et al., 2019, "Grandmaster level in StarCraft II using multi-agent reinforcement
learning", Methods: league composition, PFSP, payoff): roles, matchmaking, the payoff table, ratings, the
snapshot store, the league manager and its Ray execution."""
