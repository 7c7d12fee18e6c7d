"""Loop 4: turning judged turns into policy updates (DESIGN §6)."""
