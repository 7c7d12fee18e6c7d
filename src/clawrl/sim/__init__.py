"""Simulation: a tiny locally built model, its corpus, and simulated users."""
