"""SWE instances in SWE-bench's schema, whose repositories are local git directories.

An instance file is JSON Lines, one instance a line, with SWE-bench's fields: `instance_id`,
`repo` (`owner/name`), `base_commit` (the full hash the episode starts from), `problem_statement`
(the issue), `patch` (the reference fix), `test_patch` (the hidden tests, applied only when judging),
`FAIL_TO_PASS` and `PASS_TO_PASS` (test ids; lists, or the JSON text of lists as SWE-bench's
datasets store them). Optional: `version`, `created_at`, and our `split` (`train` when absent);
other fields are ignored. The repository of `owner/name` is the git directory `owner__name` of a
repositories directory (SWE-bench's naming), bare or not: it must contain `base_commit`.

An episode does not see that repository: `checkout` makes a new one holding `base_commit` and its
history only (fetched by hash into an empty repository, on branch `main`), so no later commit,
other branch or tag can show the fix. Checkouts are cached, keyed by the commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from clawrl.envs.protocol import Split

_FULL_HASH = re.compile(r"[0-9a-f]{40}")


class SWEInstance(BaseModel):
    """One task: fix `problem_statement` in `repo` at `base_commit` so that the hidden tests pass."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str = Field(min_length=1, description="Unique id, e.g. `clawrl-swe__textkit-3`.")
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="`owner/name`; its git directory is `owner__name`.")
    base_commit: str = Field(description="Full hash of the commit the episode starts from.")
    problem_statement: str = Field(description="The issue, as the model reads it.")
    patch: str = Field(description="The reference fix, a git diff (what the oracle applies).")
    test_patch: str = Field(description="A git diff adding the hidden tests, applied only when judging.")
    FAIL_TO_PASS: list[str] = Field(description="Tests that fail at base_commit and must pass after the fix.")
    PASS_TO_PASS: list[str] = Field(description="Tests that pass at base_commit and must keep passing.")
    version: str | None = Field(None, description="Version of the repository or its generator.")
    created_at: str | None = Field(None, description="When the issue was written.")
    split: Split = Field("train", description="Our extension: the split the instance belongs to.")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_text_list(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("base_commit")
    @classmethod
    def _full_hash(cls, value: str) -> str:
        if not _FULL_HASH.fullmatch(value):
            raise ValueError(f"base_commit must be a full 40-character commit hash, not {value!r}")
        return value


def load_instances(path: Path) -> dict[str, SWEInstance]:
    """The instances of a JSON Lines file, by id; ValueError naming the line of a bad one."""
    instances: dict[str, SWEInstance] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            instance = SWEInstance.model_validate_json(line)
        except ValidationError as error:
            raise ValueError(f"{path}:{number}: not an SWE instance: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}") from None
        if instance.instance_id in instances:
            raise ValueError(f"{path}:{number}: instance {instance.instance_id!r} appears twice")
        instances[instance.instance_id] = instance
    return instances


def repository_dir(repos_dir: Path, repo: str) -> Path:
    """Where the git directory of `owner/name` is: `repos_dir/owner__name`."""
    return repos_dir / repo.replace("/", "__")


def checkout(instance: SWEInstance, repos_dir: Path, cache_dir: Path) -> Path:
    """A repository holding only `base_commit`'s history, checked out: the image of the episode's sandbox."""
    target = cache_dir / "swe-checkouts" / instance.base_commit
    if target.is_dir():
        return target
    source = repository_dir(repos_dir, instance.repo)
    if not source.is_dir():
        raise ValueError(f"instance {instance.instance_id}: no repository {source} for {instance.repo}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        _fetch_commit(source.resolve(), instance.base_commit, staging)
        with contextlib.suppress(OSError):  # another process made the same checkout first
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _fetch_commit(source: Path, commit: str, target: Path) -> None:
    steps = (
        ["init", "-q", "--initial-branch=main"],
        ["fetch", "-q", "--no-tags", str(source), commit],
        ["checkout", "-q", "-B", "main", commit],
        ["config", "user.name", "agent"],  # so that the model can commit without being told how
        ["config", "user.email", "agent@example.com"],
    )
    for step in steps:
        done = subprocess.run(["git", *step], cwd=target, capture_output=True, text=True, env=git_env())
        if done.returncode != 0:
            raise ValueError(f"cannot check out {commit} of {source}: git {step[0]}: {done.stderr.strip()}")
    (target / ".git" / "FETCH_HEAD").unlink(missing_ok=True)


def git_env() -> dict[str, str]:
    """The environment of the git commands run here: no user or system configuration, fixed dates."""
    stamp = "2024-01-01T00:00:00+0000"
    return {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_DATE": stamp, "GIT_AUTHOR_NAME": "clawrl", "GIT_AUTHOR_EMAIL": "clawrl@example.com",
            "GIT_COMMITTER_NAME": "clawrl", "GIT_COMMITTER_EMAIL": "clawrl@example.com"}  # fmt: skip
