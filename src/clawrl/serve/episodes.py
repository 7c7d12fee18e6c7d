"""The episode endpoints (DESIGN §9): an environment rollout registers each episode before its first
step and reports how it ended after its last; the steps themselves are ordinary chat turns of the
episode's session. Store refusals become OpenAI-style 4xx error objects here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from clawrl.errors import APIError, describe_validation_error
from clawrl.serve import schemas
from clawrl.store.episodes import EpisodeEndedError, EpisodeExistsError, EpisodeStore, StepCountError, UnknownEpisodeError
from clawrl.types import Episode, EpisodeStatus

Body = TypeVar("Body", bound=BaseModel)


def parse_body(schema: type[Body], body: Any) -> Body:
    """`body` validated against `schema`, or a 400 error object saying what is wrong."""
    try:
        return schema.model_validate(body)
    except ValidationError as error:
        message, param = describe_validation_error(error)
        raise APIError(400, message, "invalid_value", param) from None


def start_episode(episodes: EpisodeStore, item: schemas.EpisodeStartRequest) -> schemas.EpisodeStartResponse:
    episode = Episode(item.session_id, item.env, item.task, item.group_id, item.group_size, item.seed)
    try:
        episodes.start(episode)
    except EpisodeExistsError:
        raise APIError(409, f"An episode '{item.session_id}' is already registered.", "episode_exists", "session_id") from None
    return schemas.EpisodeStartResponse(session_id=item.session_id)


def end_episode(episodes: EpisodeStore, session_id: str, item: schemas.EpisodeResultRequest) -> schemas.EpisodeResultResponse:
    observation = [message.model_dump(exclude_none=True) for message in item.final_observation]
    status: EpisodeStatus = "failed" if item.failed else "finished"
    try:
        recorded = episodes.end(session_id, status, item.reward, list(item.step_rewards), item.error, observation)
    except UnknownEpisodeError:
        raise APIError(404, f"No episode '{session_id}' is registered.", "episode_not_found", "session_id") from None
    except EpisodeEndedError:
        raise APIError(409, f"Episode '{session_id}' has already ended.", "episode_ended", "session_id") from None
    except StepCountError as error:
        raise APIError(400, f"{error}.", "invalid_value", "step_rewards") from None
    assert recorded.status != "running"
    return schemas.EpisodeResultResponse(session_id=session_id, status=recorded.status)
