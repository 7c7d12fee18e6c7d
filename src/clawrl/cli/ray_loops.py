"""A loop of `clawrl serve --placement ray` in a Ray actor, as the server's supervisor sees it.

The trainer (`cli/ray_trainer.py`) and each judge worker (`cli/ray_judges.py`) run in an actor
whose `run` lasts the loop's whole life, with `stop` and `where` beside it. `RayLoop` is the
server's handle on one such actor, with the surface of the `subprocess.Popen` that
`trainer_process.TrainerProcess` supervises otherwise, so both get the same supervision: an actor
that dies (killed, out of memory, its node lost) or whose loop fails is started again, as a new
actor, after the same back-off. `unplaceable` refuses at start what no node can hold: such an actor
would wait for its node forever. Ray is imported by these modules alone, only with `--placement ray`.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from clawrl.engines.ray_replica import connect_ray


def unplaceable(flags: str, part: str, cpus: float, gpus: float) -> str | None:
    """Why no node of the cluster can ever hold `part` (`cpus` and `gpus` on one node, asked for by
    `flags`), or None."""
    connect_ray()
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    wanted = {"CPU": cpus, "GPU": gpus}
    if any(all(node.get(kind, 0.0) >= amount for kind, amount in wanted.items()) for node in nodes):
        return None
    shapes = sorted({f"{node.get('CPU', 0.0):g} CPUs, {node.get('GPU', 0.0):g} GPUs" for node in nodes})
    return f"{flags}: no node of the Ray cluster has that much for {part} (its nodes: {'; '.join(shapes) or 'none'})"


class RayLoop:
    """One loop's actor, started at once: `actor_class(*args)` named `name`, with the Ray `options`
    (resources, concurrency); its `run()` is called at once and its `where()` beside it. As
    `TrainerProcess` sees a trainer (`trainer_process.TrainerHandle`)."""

    def __init__(self, name: str, actor_class: type, options: dict[str, Any], *args: Any) -> None:
        connect_ray()
        self.name = name  # `ray list actors` tells it by name
        self.actor = ray.remote(actor_class).options(name=name, **options).remote(*args)
        self._run = self.actor.run.remote()
        self._where = self.actor.where.remote()
        self._found: dict[str, Any] | None = None
        self.returncode: int | str | None = None

    @property
    def description(self) -> str:
        return f"Ray actor {self.name}, pid {self.pid}" if self.pid else f"Ray actor {self.name}"

    def _located(self) -> dict[str, Any] | None:
        """The actor's pid and node, once it has started (without waiting for it)."""
        if self._found is None and ray.wait([self._where], timeout=0)[0]:
            try:
                self._found = ray.get(self._where)
            except RayError:
                self._found = {}  # it died before it said
        return self._found

    @property
    def pid(self) -> int | None:
        return (self._located() or {}).get("pid")

    @property
    def where(self) -> dict[str, Any]:
        """What `/healthz` adds for a loop's actor: its id and its node's address."""
        found = self._located() or {}
        return {"actor": found.get("actor"), "node": found.get("node")}

    def poll(self) -> int | str | None:
        if self.returncode is None and ray.wait([self._run], timeout=0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | str:
        if self.returncode is None:
            if not ray.wait([self._run], timeout=timeout)[0]:
                raise subprocess.TimeoutExpired(self.name, timeout or 0)
            self._ended()
        assert self.returncode is not None
        return self.returncode

    def _ended(self) -> None:
        try:
            self.returncode = ray.get(self._run)
        except RayActorError as error:
            self.returncode = f"the actor died: {str(error).splitlines()[0][:300]}"
        except RayError as error:  # the loop raised: a bad setting, a store that cannot be opened, ...
            self.returncode = f"its loop failed: {str(error)[-600:]}"
        ray.kill(self.actor, no_restart=True)  # what it owns goes with it; its CPUs and GPUs are free for the next

    def terminate(self) -> None:
        try:
            self.actor.stop.remote()
        except RayError:
            pass  # gone already

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)


def actor_location() -> dict[str, Any]:
    """What an actor's `where()` answers: its pid, its node's address and its actor id."""
    return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(), "actor": ray.get_runtime_context().get_actor_id()}
