"""Model runtimes behind one protocol (DESIGN §7); `build_engine` picks one from the config."""

from __future__ import annotations

from clawrl.config import EngineConfig
from clawrl.engines.base import Engine, GenerationStream, SamplingParams, TokenStep

__all__ = ["Engine", "GenerationStream", "SamplingParams", "TokenStep", "build_engine"]


def build_engine(config: EngineConfig, model_path: str | None = None) -> Engine:
    """The engine `config` asks for, constructed but not started (call `await engine.start()`).

    `model_path` is where the weights are (a local directory or a hub id); None means
    `config.model` itself. Names that stand for locally built models (`tiny`) are resolved by
    the caller (`clawrl.sim.models.resolve_model`), so that engines never depend on how those
    models are made. With several replicas (`--replicas`, or several `--engine-url`s), one engine
    of the kind per replica behind a router (`clawrl.engines.replicas`); with `--placement ray`,
    each in a Ray actor (`clawrl.engines.ray_replica`).
    """
    if config.engine == "openai" and len(config.engine_urls) > 1:
        replicas = [config.model_copy(update={"engine_url": url}) for url in config.engine_urls]
    else:
        replicas = [config] * config.replicas
    if config.placement == "ray":
        from clawrl.engines.ray_replica import RayReplica, connect_ray
        from clawrl.engines.ray_weights import VersionShipper

        connect_ray()
        # one shipper for all replicas: a version is read and put into the object store once; an
        # `openai` engine's server, not its actor, reads a version, so it gets the path
        by_object_store = config.weights_transfer == "object-store" and config.engine != "openai"
        shipper = VersionShipper(config.weights_bucket_mib) if by_object_store else None
        engines = [RayReplica(_build_one, replica, model_path, shipper) for replica in replicas]
    else:
        engines = [_build_one(replica, model_path) for replica in replicas]
    if len(engines) == 1:
        return engines[0]
    from clawrl.engines.replicas import ReplicatedEngine

    return ReplicatedEngine(engines, restarts=config.replica_restarts)  # only replicas in actors of their own restart


def _build_one(config: EngineConfig, model_path: str | None) -> Engine:
    if config.engine == "hf":
        # Imported here so that importing the protocol does not pull in PEFT and model code.
        from clawrl.engines.hf import HFEngine

        return HFEngine(config, model_path=model_path)
    if config.engine == "vllm":
        from clawrl.engines.vllm import VLLMEngine

        return VLLMEngine(config, model_path=model_path)
    if config.engine == "openai":
        from clawrl.engines.remote import RemoteEngine

        return RemoteEngine(config, model_path=model_path)
    raise ValueError(f"unknown engine {config.engine!r}")
