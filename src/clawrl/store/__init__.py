"""Loop 2: the durable trajectory store, the only state the loops share."""

from clawrl.store.repository import NewJudgment, NewTurn, Store

__all__ = ["NewJudgment", "NewTurn", "Store"]
