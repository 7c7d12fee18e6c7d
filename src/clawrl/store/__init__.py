"""Loop 2: the durable trajectory store, the only state the loops share."""

from clawrl.store.repository import Store

__all__ = ["Store"]
