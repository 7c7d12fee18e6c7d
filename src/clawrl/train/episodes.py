"""From recorded episode groups to training samples (DESIGN §9, Track 2).

Step reward of step t of an episode of T steps (t from 0):

    r_t = outcome * gamma^(T-1-t) + coef * judge_t      (t < T-1)
    r_{T-1} = outcome

`judge_t` is the judge's score of the step (+1, -1, 0) from its next state (the tool results); a
step with no next state has judge_t = 0. The last step is scored by the outcome alone: what came
after it is the episode's end (`finish` answered "the task is being checked", a `submit`, a page
saying the task is over), which tells a judge nothing of the step's quality; the outcome is its
verdict. Judged, such an acknowledgement reads as a tool that succeeded (+1), so quitting at once
earned +coef: in the terminal micro split's groups where every rollout failed, that made an
immediate `finish` the best-paid action, and two of three seeds drifted towards quitting.

Advantages are normalised within the group of G rollouts of one task, *per step index*: for each
t, over the group's finished episodes that have a step t,

    A_t = (r_t - mean) / (std + eps)      (population std, eps = ADVANTAGE_EPS)

Steps at one index are comparable (same distance from the start of the same task); an episode
longer than the others has its extra steps compared with those of the episodes that reached them.
Where the rewards at an index are all equal (also: a single episode reaches it) there is no signal:
those steps are dropped as `flat_group`, so a group whose rewards are all equal is dropped whole.
Failed episodes are dropped (`failed_episode`) and take no part in the normalisation.

A group's samples are built once every episode of the group has ended and (with a judge
coefficient) every step with a next state has been judged; the advantage is the sample's reward,
an RL sample (A = w_rl * reward for every response token; the recorded ids train, never re-tokenized).
"""

from __future__ import annotations

import statistics

from clawrl.store.episodes import EpisodeGroup, EpisodeStore, PlayedEpisode
from clawrl.store.training import TrainingStore
from clawrl.types import DropReason, Method, Sample, SampleStatus

ADVANTAGE_EPS = 1e-6


def step_rewards(outcome: float, judge_scores: list[int | None], gamma: float, judge_coef: float) -> list[float]:
    """r_t = outcome * gamma^(T-1-t) + coef * judge_t for each step but the last (an unjudged step scores 0);
    the last step's reward is the outcome (see the module docstring)."""
    last = len(judge_scores) - 1
    return [outcome * gamma ** (last - t) + (judge_coef * (score or 0) if t < last else 0.0) for t, score in enumerate(judge_scores)]


def group_advantages(rewards: list[list[float]], eps: float = ADVANTAGE_EPS) -> list[list[float | None]]:
    """Each episode's step rewards normalised per step index over the group; None where the index has no spread."""
    longest = max((len(episode) for episode in rewards), default=0)
    by_index: list[tuple[float, float] | None] = []
    for t in range(longest):
        column = [episode[t] for episode in rewards if t < len(episode)]
        flat = max(column) == min(column)  # exact: equal rewards are computed identically
        by_index.append(None if flat else (statistics.fmean(column), statistics.pstdev(column)))
    return [[_normalised(reward, by_index[t], eps) for t, reward in enumerate(episode)] for episode in rewards]


def _normalised(reward: float, moments: tuple[float, float] | None, eps: float) -> float | None:
    if moments is None:
        return None
    mean, std = moments
    return (reward - mean) / (std + eps)


def group_ready(group: EpisodeGroup, judge_coef: float) -> bool:
    """With a judge term, every step of a finished episode that has a next state must be judged first."""
    if judge_coef == 0:
        return True
    finished = [episode for episode in group.episodes if episode.episode.status == "finished"]
    return all(step.judge_score is not None for episode in finished for step in episode.steps if step.has_next_state)


class EpisodeSampleBuilder:
    """Turns every complete, judged episode group into sample rows (one per step)."""

    def __init__(
        self,
        episodes: EpisodeStore,
        training: TrainingStore,
        method: Method,
        gamma: float,
        judge_coef: float,
        max_context_tokens: int | None = None,
    ) -> None:
        self.episodes, self.training, self.method = episodes, training, method
        self.gamma, self.judge_coef = gamma, judge_coef
        self.max_context_tokens = max_context_tokens  # a longer step is dropped as too_long, never truncated

    def build(self, limit: int = 16) -> int:
        """Give the steps of up to `limit` ready groups their samples; returns how many samples were written."""
        samples = [sample for group in self.episodes.groups_to_sample(limit) if group_ready(group, self.judge_coef)
                   for sample in self._group_samples(group)]  # fmt: skip
        if samples:
            self.training.add_samples(samples)
        return len(samples)

    def _group_samples(self, group: EpisodeGroup) -> list[Sample]:
        finished = [episode for episode in group.episodes if episode.episode.status == "finished"]
        rewards = [self._rewards(episode) for episode in finished]
        samples = [
            _sample(step.turn.id, step.turn.policy_version, 0.0, "failed_episode")
            for episode in group.episodes
            if episode.episode.status == "failed"
            for step in episode.steps
            if not step.has_sample
        ]
        for episode, advantages in zip(finished, group_advantages(rewards)):
            for step, advantage in zip(episode.steps, advantages):
                if step.has_sample:
                    continue
                turn = step.turn
                if advantage is None:
                    samples.append(_sample(turn.id, turn.policy_version, 0.0, "flat_group"))
                elif not turn.trainable or not turn.response_token_ids:
                    samples.append(_sample(turn.id, turn.policy_version, advantage, "untrainable"))
                elif self._too_long(len(turn.prompt_token_ids) + len(turn.response_token_ids)):
                    samples.append(_sample(turn.id, turn.policy_version, advantage, "too_long"))
                elif self.method == "opd":  # OPD learns from hints; an episode step's signal is its reward
                    samples.append(_sample(turn.id, turn.policy_version, advantage, "no_signal"))
                else:
                    samples.append(_sample(turn.id, turn.policy_version, advantage, None))
        return samples

    def _too_long(self, tokens: int) -> bool:
        return self.max_context_tokens is not None and tokens > self.max_context_tokens

    def _rewards(self, played: PlayedEpisode) -> list[float]:
        outcome = played.episode.reward or 0.0
        return step_rewards(outcome, [step.judge_score for step in played.steps], self.gamma, self.judge_coef)


def _sample(turn_id: str, behaviour_version: int, reward: float, drop_reason: DropReason | None) -> Sample:
    """An RL sample of an episode step: ready, or dropped for `drop_reason`."""
    status: SampleStatus = "ready" if drop_reason is None else "dropped"
    return Sample(turn_id, status, "rl" if drop_reason is None else "none", reward, behaviour_version, drop_reason=drop_reason)
