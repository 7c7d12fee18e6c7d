"""General-agent environments (DESIGN §9): one protocol, its HTTP shape, the families, scripted policies and rollouts."""
