"""Prometheus metrics of the serving loop, on a registry of its own (one per app, so tests can
run several servers in one process)."""

from __future__ import annotations

from dataclasses import asdict
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from clawrl.engines.base import Engine
from clawrl.engines.replicas import ReplicatedEngine
from clawrl.store import Store
from clawrl.trainer_process import TrainerProcess


class JudgmentCollector:
    """Judge figures read from the store at scrape time, so verdicts written by a standalone
    `clawrl judge` on another machine show up here too. Per policy version: how many turns were
    judged (its rate is judged turns per second), the mean score (the live "eval score"), vote
    agreement, unparseable votes and total judge latency (divide by the count for the mean). And the
    backlog: turns waiting for a verdict and the age of the oldest, which grow without bound when
    judging is slower than traffic."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        judged = CounterMetricFamily("clawrl_judged_turns", "Turns judged", labels=["policy_version"])
        score = GaugeMetricFamily("clawrl_judge_mean_score", "Mean judged score", labels=["policy_version"])
        agreement = GaugeMetricFamily("clawrl_judge_vote_agreement", "Mean share of votes equal to the score", labels=["policy_version"])
        invalid = CounterMetricFamily("clawrl_judge_invalid_votes", "Judge votes that could not be parsed", labels=["policy_version"])
        latency = CounterMetricFamily("clawrl_judge_latency_seconds", "Total time spent judging", labels=["policy_version"])
        for row in self.store.judging.judgment_stats():
            version = [str(row.policy_version)]
            judged.add_metric(version, row.judged)
            score.add_metric(version, row.mean_score)
            agreement.add_metric(version, row.mean_vote_agreement)
            invalid.add_metric(version, row.invalid_votes)
            latency.add_metric(version, row.latency_s_total)
        waiting, oldest_age_s = self.store.judging.judge_backlog()
        backlog = GaugeMetricFamily("clawrl_judge_backlog_turns", "Turns waiting for a verdict", value=waiting)
        age = GaugeMetricFamily("clawrl_judge_backlog_age_seconds", "How long ago the oldest turn waiting for a verdict was recorded", value=oldest_age_s)
        yield from (judged, score, agreement, invalid, latency, backlog, age)


class TrainingCollector:
    """Trainer figures read from the store at scrape time (the trainer is another process): samples
    by status, published versions, and every StepMetrics field of the newest version's step as a
    gauge `clawrl_train_<field>` (loss, clip fraction, KL, entropy, advantage, reward, OPD share,
    staleness, log-prob drift, ...)."""

    def __init__(self, store: Store) -> None:
        self.training = store.training

    def collect(self) -> Iterator[Metric]:
        samples = GaugeMetricFamily("clawrl_train_samples", "Training samples by status", labels=["status"])
        for status, count in sorted(self.training.sample_counts().items()):
            samples.add_metric([status], count)
        versions = self.training.versions()
        published = CounterMetricFamily("clawrl_train_versions", "Policy versions published by the trainer")
        published.add_metric([], len(versions))
        yield from (samples, published)
        if not versions:
            return
        newest = versions[-1]
        step = GaugeMetricFamily("clawrl_train_step", "Optimizer steps behind the newest version")
        step.add_metric([], newest.step)
        yield step
        for name, value in asdict(newest.metrics).items():
            if isinstance(value, (int, float)):
                gauge = GaugeMetricFamily(f"clawrl_train_{name}", f"{name} of the newest version's step")
                gauge.add_metric([], value)
                yield gauge


class MemoryCollector:
    """Everyone's memory notes by state, read at scrape time: active (injected with --memory on) and
    retired (the weights follow them: `--memory-retire`)."""

    def __init__(self, store: Store) -> None:
        self.memory = store.memory

    def collect(self) -> Iterator[Metric]:
        notes = GaugeMetricFamily("clawrl_memory_notes", "Memory notes stored, by state", labels=["state"])
        for state, count in self.memory.counts().items():
            notes.add_metric([state], count)
        yield notes


class TrainerProcessCollector:
    """The trainer child process of `clawrl serve --method`, read at scrape time: up or not, restarts."""

    def __init__(self, trainer: TrainerProcess) -> None:
        self.trainer = trainer

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("clawrl_trainer_running", "1 while the trainer process is alive")
        running.add_metric([], float(self.trainer.running()))
        restarts = CounterMetricFamily("clawrl_trainer_restarts", "Times a trainer process that died was started again")
        restarts.add_metric([], self.trainer.restarts)
        yield from (running, restarts)


class JudgeFleet(Protocol):
    """The judge actors of `--placement ray --judge-actors K` (`cli/ray_judges.JudgeActors`), as
    /healthz and /metrics read them: `status()` has `actors`, `alive`, `restarts` and `workers`."""

    def status(self) -> dict[str, Any]: ...


class JudgeActorCollector:
    """The judge actors, read at scrape time: how many are alive, how often one was started again."""

    def __init__(self, judges: JudgeFleet) -> None:
        self.judges = judges

    def collect(self) -> Iterator[Metric]:
        status = self.judges.status()
        alive = GaugeMetricFamily("clawrl_judge_actors_alive", "Judge actors alive", value=status["alive"])
        wanted = GaugeMetricFamily("clawrl_judge_actors", "Judge actors asked for (--judge-actors)", value=status["actors"])
        restarts = CounterMetricFamily("clawrl_judge_actor_restarts", "Times a judge actor that died was started again",
                                       value=status["restarts"])  # fmt: skip
        yield from (alive, wanted, restarts)


class ReplicaCollector:
    """The replicas of `--replicas`, read at scrape time: which are in rotation, requests started on
    each, and how often each came back after its actor died (`--placement ray`)."""

    def __init__(self, engine: ReplicatedEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        in_rotation = GaugeMetricFamily("clawrl_replica_in_rotation", "1 while a replica gets new requests", labels=["replica"])
        requests = CounterMetricFamily("clawrl_replica_requests", "Requests started on a replica", labels=["replica"])
        restarts = CounterMetricFamily("clawrl_replica_restarts", "Times a replica whose actor died was started again "
                                       "and put back into rotation", labels=["replica"])  # fmt: skip
        for status in self.engine.replica_status():
            replica = [str(status["replica"])]
            in_rotation.add_metric(replica, float(status["in_rotation"]))
            requests.add_metric(replica, status["requests"])
            restarts.add_metric(replica, status["restarts"])
        yield from (in_rotation, requests, restarts)


class ServeMetrics:
    def __init__(self, store: Store, trainer: TrainerProcess | None = None, engine: Engine | None = None,
                 judges: JudgeFleet | None = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(JudgmentCollector(store))
        self.registry.register(TrainingCollector(store))
        self.registry.register(MemoryCollector(store))
        if trainer is not None:
            self.registry.register(TrainerProcessCollector(trainer))
        if isinstance(engine, ReplicatedEngine):
            self.registry.register(ReplicaCollector(engine))
        if judges is not None:
            self.registry.register(JudgeActorCollector(judges))
        self.requests = Counter(
            "clawrl_requests", "HTTP requests answered, by endpoint and status", ["endpoint", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "clawrl_request_latency_seconds",
            "Time from request to last byte of chat completions",
            ["stream"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            "clawrl_time_to_first_token_seconds",
            "Time from request to the first generated token",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.prompt_tokens = Counter("clawrl_prompt_tokens", "Prompt tokens fed to the engine", registry=self.registry)
        self.generated_tokens = Counter("clawrl_generated_tokens", "Tokens generated", registry=self.registry)
        self.turns = Counter("clawrl_turns_recorded", "Turns committed to the store", ["kind"], registry=self.registry)
        self.sessions = Counter(
            "clawrl_session_resolutions", "How requests were assigned to sessions", ["source"], registry=self.registry
        )
        self.next_states = Counter("clawrl_next_states", "Next states attached to earlier turns", registry=self.registry)
        self.feedback = Counter("clawrl_feedback", "Explicit feedback received", ["score"], registry=self.registry)
        self.active = Gauge("clawrl_active_requests", "Chat completions in flight", registry=self.registry)
        self.policy_version = Gauge("clawrl_policy_version", "Policy version new requests get", registry=self.registry)


async def timed_stream(events: AsyncGenerator[str, None], metrics: ServeMetrics, started: float) -> AsyncIterator[str]:
    """A streamed answer, counted as an active request and timed to its last byte (every wire API's stream)."""
    metrics.active.inc()
    try:
        async for event in events:
            yield event
    finally:
        await events.aclose()  # on a hang-up, lets the stream record what was generated
        metrics.active.dec()
        metrics.latency.labels("true").observe(time.perf_counter() - started)
