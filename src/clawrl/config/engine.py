"""The model runtime's settings (DESIGN §7): which engine, which model, on which device."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from clawrl.config.base import ComponentSettings


class EngineConfig(ComponentSettings):
    """The model runtime that serves requests (DESIGN §7)."""

    model: str = Field(
        "tiny",
        description="Model to serve: a local Hugging Face directory, a hub id, or `tiny` for the "
        "locally built tiny model (cached under --cache-dir).",
    )
    engine: Literal["hf", "vllm", "openai"] = Field(
        "hf",
        description="Engine kind: `hf` (transformers in this process), `vllm` (a vLLM server that clawrl starts "
        "from --vllm-python and drives with token ids), or `openai` (an OpenAI-compatible server at --engine-url "
        "that takes token-id prompts and returns token ids and log-probs, e.g. a vLLM you run).",
    )
    engine_url: str | None = Field(
        None, description="With --engine openai: the server's base URL, e.g. http://127.0.0.1:8000/v1; several, "
        "comma-separated, are replicas of one model (one per server, as --replicas)."
    )
    placement: Literal["local", "ray"] = Field(
        "local", description="Where the replicas and the trainer run: `local`, engines in this server, the trainer "
        "and its --train-workers as processes beside it; `ray`, each replica, the trainer and each of its workers "
        "in a Ray actor on the cluster at RAY_ADDRESS (a cluster on this machine when unset), placed by "
        "--replica-cpus, --replica-gpus, --trainer-cpus and --trainer-gpus; needs `pip install 'clawrl[ray]'`, and "
        "a run directory the server and the trainer's nodes can read (every replica's too with --weights-transfer "
        "shared-path)."
    )
    replica_cpus: float = Field(1.0, ge=0, description="With --placement ray: CPUs Ray reserves for each replica's actor.")
    replica_gpus: float = Field(0.0, ge=0, description="With --placement ray: GPUs for each replica's actor (1 on a GPU cluster).")
    replica_restarts: int = Field(
        5, ge=0, description="With --placement ray: a replica whose actor died is started again as a new actor, "
        "catches up with the versions the others serve and goes back into rotation, after the trainer's back-off "
        "(1 s, 2 s, ... at most a minute); given up on (it stays out) after this many quick failures in a row, "
        "each a start or catch-up that failed or a death within a minute of coming back. 0: a replica that dies "
        "stays out until the server restarts."
    )
    weights_transfer: Literal["object-store", "shared-path"] = Field(
        "object-store", description="With --placement ray: how a published version reaches the replica actors. "
        "`object-store`: the server reads and checks the version once and puts its files into Ray's object store "
        "(in pieces of at most --weights-bucket-mib), each actor writes its own copy on its node, checks it again "
        "and loads that, so the replicas' nodes need no shared disk; `shared-path`: each actor loads the path the "
        "store records, which must then be on a filesystem every replica's node mounts (always so with --engine "
        "openai: its servers read the version, not the actors)."
    )
    weights_bucket_mib: float = Field(
        128.0, gt=0, description="With --weights-transfer object-store: the largest piece of a version's files put "
        "into Ray's object store at once (a bigger file goes in several), which bounds what the server and each "
        "actor hold in memory while a version travels."
    )
    replicas: int = Field(
        1, ge=1, description="Copies of the model that serve side by side behind one router (engines/replicas.py): a "
        "session's requests go to the replica that holds its prefix, new ones to the least busy, a replica that "
        "fails is taken out and its unanswered requests go to another; every version loads on all. With --engine "
        "hf or vllm, that many engines in this server (on the same --device); with --engine openai, one per "
        "--engine-url."
    )
    engine_api_key: str | None = Field(None, description="With --engine openai: a bearer key for --engine-url.")
    engine_timeout_s: float = Field(
        600.0, gt=0, description="With --engine vllm|openai: the longest one call to the server may take."
    )
    vllm_python: Path | None = Field(
        None,
        description="With --engine vllm: the Python of the environment vLLM is installed in; unset: .venv-vllm "
        "in the current directory or beside clawrl's source (what `make test` creates).",
    )
    max_lora_rank: int = Field(
        64, ge=1, description="With --engine vllm: the largest LoRA rank the server accepts (vLLM reserves room for it)."
    )
    max_loras: int = Field(
        4, ge=2, description="With --engine vllm: LoRA adapters on the device at once, in one batch (vLLM's "
        "--max-loras); the others clawrl keeps loaded wait in host memory (--max-loaded-adapters)."
    )
    max_loaded_adapters: int = Field(
        8,
        ge=1,
        description="LoRA versions an engine keeps loaded beside those requests are using: with --adapters per-user, "
        "the adapters of the users who asked least recently are unloaded beyond it (never while a request uses one) "
        "and loaded again on their next request.",
    )
    vllm_kv_cache_gib: float = Field(
        1.0, gt=0, description="With --engine vllm on a CPU: memory for its KV cache (VLLM_CPU_KVCACHE_SPACE)."
    )
    vllm_args: str = Field(
        "", description="With --engine vllm: more arguments for vLLM's server, as on its command line (e.g. "
        "`--gpu-memory-utilization 0.5`)."
    )
    vllm_start_timeout_s: float = Field(
        600.0, gt=0, description="With --engine vllm: how long the server may take to load before clawrl gives up."
    )
    device: str = Field("auto", description="`auto` (CUDA when present), `cpu` or `cuda[:N]`.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype; `auto` is float32 on CPU and bfloat16 on CUDA."
    )
    quantize: Literal["none", "nf4"] = Field(
        "none",
        description="With --engine hf: `nf4` stores the frozen base's linear layers in 4 bits (QLoRA's NormalFloat, "
        "one scale per 64 weights) in the server and the trainer, and computes each layer in --dtype as it runs: "
        "about a quarter of the weights' memory for some speed. LoRA only (--full trains every weight); the "
        "embeddings and the output layer stay in --dtype (docs/sizing.md).",
    )
    max_batch_size: int = Field(32, ge=1, description="Most sequences decoded in one batch.")
    prefix_cache_gib: float = Field(
        1.0, ge=0, description="With --engine hf: memory for the KV of recent prompts, so that a prompt starting like "
        "one of them (an agent's next turn) prefills only the rest; per policy version; 0 turns it off. (vLLM has "
        "its own prefix caching.)"
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads when running on the CPU (process-wide; with --engine vllm, the OpenMP "
        "threads of vLLM's CPU worker); unset keeps torch's default. Tiny models run fastest with 1: their "
        "matrices are too small to split.",
    )
    max_context_tokens: int | None = Field(
        None, ge=16, description="Prompt plus response limit; defaults to the model's max_position_embeddings."
    )
    cache_dir: Path = Field(
        Path.home() / ".cache" / "clawrl", description="Where locally built models (the tiny model) are cached."
    )
    seed: int = Field(0, description="Seed of the tiny model when --model tiny.")
    share_weights: bool = Field(
        True,
        description="On a CPU, the server and the trainer map one copy of the base weights (the page cache keeps "
        "it once); weights stored in another dtype than served are converted once into --cache-dir for that. "
        "Off: each process converts and holds its own copy (docs/sizing.md).",
    )

    @model_validator(mode="after")
    def _quantize_needs_hf(self) -> Self:
        if self.quantize != "none" and self.engine != "hf":
            raise ValueError(f"--quantize {self.quantize} works with --engine hf; vLLM has its own quantization "
                             "(pass it in --vllm-args)")
        return self

    @property
    def engine_urls(self) -> list[str]:
        """The servers of `--engine openai`, one per replica."""
        return [url.strip() for url in (self.engine_url or "").split(",") if url.strip()]

    @model_validator(mode="after")
    def _one_server_per_remote_replica(self) -> Self:
        if self.engine == "openai" and self.replicas > 1 and len(self.engine_urls) != self.replicas:
            raise ValueError(f"--replicas {self.replicas} with --engine openai needs as many servers in --engine-url "
                             f"(comma-separated), got {len(self.engine_urls)}")
        return self

    @model_validator(mode="after")
    def _openai_needs_a_server(self) -> Self:
        # the `openai` engine is a client of that server: without its URL there is nothing to serve with
        if self.engine == "openai" and not self.engine_url:
            raise ValueError("--engine openai needs --engine-url; give the server's base URL "
                             "(e.g. http://127.0.0.1:8000/v1)")
        return self
