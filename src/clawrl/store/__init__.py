"""Loop 2: the durable trajectory store, the only state the loops share."""

from clawrl.store.repository import NewTurn, Store

__all__ = ["NewTurn", "Store"]
