"""The trainer loop (DESIGN §6, loop 4): samples in, policy versions out.

It runs in its own OS process (`clawrl train`, or started by `clawrl serve --method ...`), never
in the serving process: the GIL and the CPU are shared. Each round it

1. follows the store's serving pointer: on start, and after `clawrl versions rollback`, it loads
   that version's weights and optimizer state (or the base weights for version 0) and trains on
   from there, so a rollback also rolls the trainer back;
2. turns newly judged turns into sample rows (`samples.py`; OPD teacher log-probs are computed
   here, with this process's model), and the steps of complete episode groups into samples with
   group-normalised advantages (`episodes.py`);
3. takes the oldest ready samples, dropping those more than `max_staleness` versions old; with
   `batch_size` of them it makes one update (`update.update_step`);
   with `--adapters per-user` every user has a lineage of their own: of the users with a batch
   ready, the one whose lineage stepped least recently is stepped, on their samples alone, from
   their lineage's serving version (its adapter and optimizer state are read from its version
   directory, so a switch between users costs one load and nothing is lost on a restart);
4. writes the new version directory and registers it, marking its samples trained and moving the
   serving pointer, in one store transaction (`store/training.py`). If a rollback happened during
   the step, the step is thrown away and its samples stay ready. With `--keep-versions K` it then
   removes the weights of the lineage's versions no one needs (`versions/retention.py`).

Resuming is exact: a version directory carries the optimizer and RNG state, and the store says
which samples are trained. A version directory without a store row (the trainer was killed
between writing and registering it) is deleted on start and its step redone.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.exc import SQLAlchemyError
from transformers import AutoTokenizer, PreTrainedModel

from clawrl.allocator import return_freed_memory
from clawrl.config import EngineConfig, LossConfig, TrainConfig
from clawrl.model.constraints import GrammarVocabulary, allowed_bits
from clawrl.model.device import resolve_device
from clawrl.model.scoring import score_response
from clawrl.store import Store
from clawrl.store.training import PointerMovedError, SamplesTakenError
from clawrl.train.episodes import EpisodeSampleBuilder
from clawrl.train.policy import TrainedPolicy
from clawrl.train.samples import SampleBuilder
from clawrl.train.trackers import open_trackers
from clawrl.train.workers import WorkerGroup, WorkersLost
from clawrl.types import SHARED_LINEAGE, PolicyVersion, ScoredResponse, TrainingExample
from clawrl.versions.files import Manifest, discard_unregistered, verify_version, write_version
from clawrl.versions.retention import VersionPruner

log = logging.getLogger(__name__)

_NO_HEAD = -1  # the loaded weights match no version (a step was thrown away): reload before training


def _worker_group(engine_config: EngineConfig) -> type[WorkerGroup]:
    """Where the data-parallel workers run: local processes, or Ray actors with `--placement ray`."""
    if engine_config.placement == "ray":
        from clawrl.train.ray_workers import RayWorkerGroup  # imports Ray: only when asked for

        return RayWorkerGroup
    return WorkerGroup


class TrainerLockedError(RuntimeError):
    """Another trainer already trains this run directory."""


def loss_config(config: TrainConfig, method: str) -> LossConfig:
    """The update's objective: the loss fields of the trainer's settings, with the method resolved."""
    return LossConfig.model_validate(config.model_dump(include=set(LossConfig.model_fields)) | {"method": method})


class Trainer:
    def __init__(self, config: TrainConfig, engine_config: EngineConfig, store: Store, run_dir: Path,
                 server_pid: int | None = None) -> None:
        """`server_pid`: the `clawrl serve` that started this trainer; on a GPU its base weights are mapped."""
        self.config, self.run_dir = config, Path(run_dir)
        self.method = config.method or "combine"
        self.per_user = config.adapters == "per-user"  # a lineage per user (DESIGN §12), else the shared one
        self.lineage = SHARED_LINEAGE  # the lineage whose weights are in memory
        self._stepped_at: dict[str, float] = {}  # per lineage, when this trainer last stepped it: who goes next
        self.training = store.training
        self.device = resolve_device(engine_config.device)
        if self.device.type == "cpu" and engine_config.cpu_threads:
            torch.set_num_threads(engine_config.cpu_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(engine_config.model)
        self.policy = TrainedPolicy(config, engine_config, self.device, server_pid)
        text_config = self.model.config.get_text_config()
        self.max_context_tokens = engine_config.max_context_tokens or text_config.max_position_embeddings
        # ranks 1..M-1 of a data-parallel trainer (`--train-workers M`), started with `start()`
        workers = config.train_workers - 1
        self.workers = _worker_group(engine_config)(workers, config, engine_config, self.device) if workers else None
        self.loss_config = loss_config(config, self.method)
        self.builder = SampleBuilder(
            self.training,
            self.tokenizer,
            self.method,
            self._teacher_score,
            self._teacher_name,
            topk=config.opd_topk,
            max_context_tokens=self.max_context_tokens,
            reward_baseline_samples=config.reward_baseline_samples,
            per_user=self.per_user,
            user_notes=store.memory.notes if config.memory_train == "without-notes" else None,
        )
        self.episode_builder = EpisodeSampleBuilder(
            store.episodes, self.training, self.method, config.episode_gamma, config.step_judge_coef,
            max_context_tokens=self.max_context_tokens,
        )
        self.head = 0  # the version the weights in memory are: the starting weights so far
        self.judging = store.judging
        self.pruner = (VersionPruner(self.training, self.run_dir, config.keep_versions, config.keep_versions_grace_s)
                       if config.keep_versions is not None else None)  # fmt: skip
        self.trackers = open_trackers(list(config.report_to), self.run_dir, config.report_project,
                                      {**config.model_dump(mode="json"), "model": str(engine_config.model), "method": self.method})  # fmt: skip

    @property
    def model(self) -> Any:
        """The model being trained (`TrainedPolicy.model`)."""
        return self.policy.model

    # --- the loop -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the data-parallel workers, if any, discard unregistered version directories and load
        the version serving uses."""
        if self.workers is not None:
            self.workers.start()
        on_disk = {path.name for path in (self.run_dir / "policy").iterdir()} if (self.run_dir / "policy").is_dir() else set()
        for lineage in sorted(on_disk | set(self.training.lineages())):
            with_weights = set(self.training.version_numbers(lineage, with_pruned=False))
            try:
                discarded = discard_unregistered(self.run_dir, lineage, with_weights)
            except ValueError:  # a pointer named like a path (refused since; a store from before may hold one)
                log.warning("skipped lineage %r: not a lineage name, so no directory of it is looked at", lineage)
                continue
            for path in discarded:
                log.warning("discarded %s: never registered, or pruned (a trainer stopped in between)", path)
        self._follow_pointer(self.lineage)

    def run(self, max_steps: int | None = None, idle_exit_s: float | None = None,
            stop: threading.Event | None = None) -> int:
        """Train until `max_steps` steps were made (None: forever) or `stop` is set; returns the steps made."""
        made, idle_since = 0, time.monotonic()
        while (max_steps is None or made < max_steps) and not (stop is not None and stop.is_set()):
            if self.run_once():
                made, idle_since = made + 1, time.monotonic()
                continue
            if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                break
            time.sleep(self.config.train_poll_s)
        return made

    def run_once(self) -> bool:
        """One round: follow the pointer, build samples, and step a lineage whose batch is ready.

        A data-parallel worker lost on the way throws the round away: the group is started again and
        every rank reloads the serving version before the next step (the samples are still ready).
        """
        try:
            return self._round()
        except WorkersLost as lost:
            assert self.workers is not None
            self.workers.restart(lost)
            self.head = _NO_HEAD
            return False

    def _round(self) -> bool:
        self._follow_pointer(self.lineage)
        self.builder.build()
        self.episode_builder.build()
        lineage = self._next_lineage()
        if lineage is None:
            return False
        self._follow_pointer(lineage)
        batch = self._take_batch()
        if batch is None:
            return False
        self._train_and_publish(batch)
        self._stepped_at[lineage] = time.monotonic()
        return True

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
        for tracker in self.trackers:
            tracker.close()

    # --- one step ---------------------------------------------------------------------------------
    def _next_lineage(self) -> str | None:
        """The lineage to step: the shared one, or, per user, of the users with a batch's worth of
        ready samples the one stepped least recently (then the one waiting longest): a user who
        talks a lot cannot starve one who talks little."""
        if not self.per_user:
            return SHARED_LINEAGE
        ready = {user: oldest for user, (count, oldest) in self.training.ready_by_user().items()
                 if count >= self.config.batch_size}  # fmt: skip
        if not ready:
            return None
        return min(ready, key=lambda user: (self._stepped_at.get(user, 0.0), ready[user]))

    def _take_batch(self) -> list[TrainingExample] | None:
        """The lineage's oldest `batch_size` ready samples once there are that many, stale ones dropped first."""
        while True:
            examples = self.training.ready_samples(self.config.batch_size, self.lineage if self.per_user else None)
            behind = self._versions_behind()
            stale = [example.turn.id for example in examples if behind(example) > self.config.max_staleness]
            if not stale:
                return examples if len(examples) == self.config.batch_size else None
            self.training.drop_samples(stale, "stale")
            log.info("dropped %d sample(s) more than %d versions old", len(stale), self.config.max_staleness)

    def _versions_behind(self) -> Callable[[TrainingExample], int]:
        """How many versions of the lineage in memory were published after a sample's behaviour version."""
        numbers = self.training.version_numbers(self.lineage)
        return lambda example: len(numbers) - bisect.bisect_right(numbers, example.sample.behaviour_version)

    def _train_and_publish(self, batch: list[TrainingExample]) -> None:
        behind = self._versions_behind()
        batch = self._with_grammar_masks(batch)
        if self.workers is None:
            metrics = self.policy.update(batch, self.loss_config)
        else:
            metrics = self.workers.update(self.policy, batch, self.loss_config)
        metrics.mean_staleness = sum(behind(example) for example in batch) / len(batch)
        sample_ids = [example.turn.id for example in batch]
        if metrics.skipped_step:  # a non-finite gradient: the weights are unchanged, the batch would do it again
            self.training.drop_samples(sample_ids, "non_finite_gradient")
            log.warning("dropped a batch of %d samples whose gradient was not finite", len(sample_ids))
            return
        version, parent, step = self.training.next_version_number(), self.head, self.policy.step + 1
        manifest = Manifest(version, parent, step, self.policy.kind, sample_ids, asdict(metrics), lineage=self.lineage)
        path, sha256 = write_version(self.run_dir, manifest, self.policy.save_weights, self.policy.save_trainer_state)
        record = PolicyVersion(version, parent, self.policy.kind, str(path.resolve()), sha256, step, metrics,
                               lineage=self.lineage)  # fmt: skip
        try:
            self.training.register_version(record, sample_ids)
        except (PointerMovedError, SamplesTakenError) as reason:
            shutil.rmtree(path)
            self.head = _NO_HEAD  # these weights belong to no version: reload from the pointer
            log.warning("step thrown away, v%d not published: %s", version, reason)
            return
        self.head, self.policy.step = version, step
        self._report(version, parent, metrics)
        if self.pruner is not None:
            try:
                self.pruner.prune(self.lineage)
            except SQLAlchemyError:  # a busy store must not stop training: the next publish prunes what this did not
                log.exception("removing unkept versions of %s failed", self.lineage)
        return_freed_memory()  # the step's activations: memory the host gets back until the next step
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # and on a GPU the server's keys and values may use them in between

    def _report(self, version: int, parent: int, metrics: StepMetrics) -> None:
        log.info(
            "published v%d (from v%d, step %d): %d samples, %d tokens, loss %.4f, mean |log pi_old - log pi_behaviour| "
            "%.4f, clip %.3f, kl %.4f, reward %.3f, opd %.2f, staleness %.2f, %.1f s",
            version, parent, self.policy.step, metrics.num_samples, metrics.num_tokens, metrics.loss, metrics.logprob_drift,
            metrics.clip_fraction, metrics.approx_kl, metrics.mean_reward, metrics.opd_fraction, metrics.mean_staleness,
            metrics.step_seconds,
        )  # fmt: skip
        if self.trackers:
            reported = {f"train/{name}": float(value) for name, value in asdict(metrics).items()} | {"train/version": version}
            reported |= self._live_score(parent)
            for tracker in self.trackers:
                # at the version's number: it only grows, where the step count goes back after a rollback
                tracker.log(reported | {"train/step": self.policy.step}, version)

    def _live_score(self, version: int) -> dict[str, float]:
        """The judge's mean verdict on the turns `version` served (the version this step started from), so far."""
        stats = next((row for row in self.judging.judgment_stats() if row.policy_version == version), None)
        return {"judge/live_score": stats.mean_score, "judge/judged": stats.judged} if stats else {}

    # --- versions in and out ----------------------------------------------------------------------
    def _follow_pointer(self, lineage: str) -> None:
        """Make the weights in memory those of the version `lineage`'s serving pointer names."""
        target = self.training.serving_version(lineage)
        if lineage == self.lineage and target == self.head:
            return
        path = self._version_path(target, lineage) if target else None
        if path is None:
            self.policy.load_initial()
        else:
            self.policy.load(path)
        if self.workers is not None:
            self.workers.load(path)
        log.info("training %s from v%d (step %d)", lineage, target, self.policy.step)
        self.lineage, self.head = lineage, target

    def _version_path(self, version: int, lineage: str) -> Path:
        """The directory of `lineage`'s `version`, checked against its store row and checksums."""
        row = self.training.version(version)
        if row is None:
            raise RuntimeError(f"the serving pointer names v{version}, which is not registered")
        if row.lineage != lineage:
            raise RuntimeError(f"the serving pointer of {lineage!r} names v{version}, a version of {row.lineage!r}")
        if row.kind != self.policy.kind:
            raise RuntimeError(f"v{version} holds {row.kind} weights but this trainer trains {self.policy.kind} (--full)")
        path = Path(row.path)
        verify_version(path, row.sha256, trainer_state=True)
        return path

    # --- the OPD teacher --------------------------------------------------------------------------
    def _teacher_score(self, prompt: list[int], response: list[int], top_k: int, grammar: str | None = None) -> ScoredResponse:
        masks = allowed_bits(grammar, self._grammar_vocabulary(), response) if grammar is not None else None
        with self._teacher() as teacher:
            return score_response(teacher, prompt, response, top_k, masks)

    def _grammar_vocabulary(self) -> GrammarVocabulary:
        """The tokens as the serving engine's grammar saw them: the same tokenizer and logits width."""
        return GrammarVocabulary.of(self.tokenizer, self.model.config.get_text_config().vocab_size)

    def _with_grammar_masks(self, batch: list[TrainingExample]) -> list[TrainingExample]:
        """`batch`, each turn decoded under a grammar given the masks it was sampled under (replayed)."""
        for example in batch:
            if example.turn.sampling.grammar is not None and example.allowed_bits is None:
                example.allowed_bits = allowed_bits(example.turn.sampling.grammar, self._grammar_vocabulary(),
                                                    example.turn.response_token_ids)  # fmt: skip
        return batch

    @contextmanager
    def _teacher(self) -> Iterator[PreTrainedModel]:
        if self.config.teacher == "policy":
            yield self.model
        elif self.policy.reference is not None:
            yield self.policy.reference
        else:
            with self.model.disable_adapter():
                yield self.model

    def _teacher_name(self) -> str:
        return "base" if self.config.teacher == "base" else f"policy v{self.head}"


@contextmanager
def trainer_lock(run_dir: Path) -> Iterator[None]:
    """Hold RUN_DIR/trainer.lock: two trainers on one run would publish over each other."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as the store makes it (store/database.py)
    with (run_dir / "trainer.lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrainerLockedError(f"another trainer is running on {run_dir}") from None
        yield
