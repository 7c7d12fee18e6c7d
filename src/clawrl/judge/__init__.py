"""Loop 3: judging turns from their next state."""
