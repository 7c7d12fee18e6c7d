"""The built-in terminal tasks: a seeded generator writing task folders in Harbor's layout.

Each task is a folder any Harbor-style runner can read:

    <task-id>/task.toml              [metadata] category, difficulty, split; [verifier]/[agent] timeouts
    <task-id>/instruction.md         what the model is asked to do
    <task-id>/environment/Dockerfile for Docker-based runners; clawrl ignores it (no Docker)
    <task-id>/environment/workspace/ the starting files: the sandbox's /workspace (COPYed by the Dockerfile)
    <task-id>/tests/test.sh          writes 1 or 0 to /logs/verifier/reward.txt
    <task-id>/solution/solve.sh      the reference solution (run in /workspace)

Categories: files, text, permissions, archives and git. Every template is played in `VARIANTS`
variants with different names and contents; the first `EVAL_VARIANTS` of each template are the
eval split, the others train, so eval asks for the same skills on material the model has not seen
(several variants per template, so that an eval measures the skill rather than one set of names).
The two splits draw their names from separate pools (`EVAL_WORDS`, `TRAIN_WORDS`): no name an eval
task uses occurs in any training task, so a gain on eval is not a name recalled from training; and
no two eval tasks have the same instruction. Git tasks are
generated only when git is installed (the sandbox sees the host's /usr, and preparing a
repository needs git here): on a machine without git the other tasks are the same ones.

Generation is deterministic in the seed, and cheap; `generated_tasks_dir` writes the set once
under a cache directory (atomically: concurrent first runs do not see half a set).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

GENERATOR_VERSION = 6  # bump when the tasks change, so caches of the old set are not reused
VARIANTS = 6
EVAL_VARIANTS = 3
REWARD_FILE = "/logs/verifier/reward.txt"
EVAL_WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel",
              "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "sierra", "tundra", "umber", "violet")
TRAIN_WORDS = ("amber", "birch", "cobalt", "dune", "elm", "falcon", "glacier", "hazel", "iris", "jasper", "kelp",
               "lagoon", "mesa", "nimbus", "opal", "prairie", "quill", "reef", "saffron", "thistle", "upland", "willow")
WORDS = EVAL_WORDS + TRAIN_WORDS  # every name the built-in tasks use (made-up demonstrations avoid them all)
_MAX_REDRAWS = 20
_DOCKERFILE = """\
# For Docker-based runners (Harbor); clawrl's sandbox uses workspace/ directly and ignores this file.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 git && rm -rf /var/lib/apt/lists/*
WORKDIR /workspace
COPY workspace/ /workspace/
"""
_ONE_WORD_QUOTE = re.compile(r"`([^`\s]+)`")
_GIT_IDENTITY = "git has no identity configured: give one, e.g. `git -c user.name=agent -c user.email=agent@example.com commit ...`."


@dataclass
class TaskSpec:
    """One generated task before it is written out."""

    instruction: str
    checks: list[str]  # shell conditions run in /workspace; all must hold for reward 1
    solution: str
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    git_repos: dict[str, str] = field(default_factory=dict)  # directory -> commit message of its first commit
    uncommitted: dict[str, str] = field(default_factory=dict)  # files written after that commit
    difficulty: str = "easy"


def generated_tasks_dir(cache_dir: Path, seed: int) -> Path:
    """The built-in task set for `seed`, generated under `cache_dir` on first use."""
    with_git = shutil.which("git") is not None
    target = cache_dir / "terminal-tasks" / f"v{GENERATOR_VERSION}-seed{seed}{'-git' if with_git else ''}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    generate_tasks(staging, seed, with_git)
    try:
        staging.rename(target)
    except OSError:  # another process finished first: its set is the same
        shutil.rmtree(staging, ignore_errors=True)
    return target


def generate_tasks(
    out_dir: Path, seed: int, with_git: bool, prefixes: tuple[str, ...] = (), words: Sequence[str] | None = None
) -> list[Path]:
    """Write every task folder under `out_dir` (only those whose id starts with one of `prefixes`, when given).

    `words` are the names the tasks' files, directories and contents are made of: by default eval
    tasks use `EVAL_WORDS` and training tasks `TRAIN_WORDS`; a pool given here serves both splits
    (the same skills on other names: the tiny agent's demonstrations).
    """
    written = []
    for category, name, template in _TEMPLATES:
        if (category == "git" and not with_git) or not f"{category}-{name}-".startswith(prefixes or ""):
            continue
        instructions: set[str] = set()
        for variant in range(VARIANTS):
            split = "eval" if variant < EVAL_VARIANTS else "train"
            pool = words if words is not None else EVAL_WORDS if split == "eval" else TRAIN_WORDS
            spec = _distinct_variant(template, pool, f"terminal:{seed}:{name}:{variant}", instructions)
            task_dir = out_dir / f"{category}-{name}-{variant}"
            _write_task(task_dir, spec, category, split, seed)
            written.append(task_dir)
    return written


def _distinct_variant(
    template: Callable[[random.Random, Sequence[str]], TaskSpec], words: Sequence[str], key: str, seen: set[str]
) -> TaskSpec:
    """The template's variant for `key`, drawn again (with a numbered key) while its instruction repeats one in `seen`."""
    spec = template(random.Random(key), words)
    for redraw in range(1, _MAX_REDRAWS + 1):
        if spec.instruction not in seen:
            break
        spec = template(random.Random(f"{key}:{redraw}"), words)
    seen.add(spec.instruction)
    return spec


def made_up_task(prefixes: tuple[str, ...], rng: random.Random, words: Sequence[str]) -> TaskSpec:
    """One task of a template whose id starts with one of `prefixes`, on `words`, in memory (nothing written)."""
    templates = [template for category, name, template in _TEMPLATES if f"{category}-{name}-".startswith(prefixes)]
    if not templates:
        raise ValueError(f"no task template starts with any of {prefixes}")
    spec = rng.choice(templates)(rng, words)
    spec.instruction = bare_names(spec.instruction)
    return spec


def bare_names(instruction: str) -> str:
    """The instruction with names (one word in backticks) written bare: `fjord.key` becomes fjord.key.

    A byte-level BPE tokenizer splits a word after a backtick into other pieces than the same word
    after a space (`alpha` is al|p|ha, " alpha" is Ġa|l|p|ha in the tiny tokenizer), and a command
    names its files after spaces: a model must re-spell each name to use it. Real models learnt
    that in pre-training; the tiny agents cannot, and copied 7 of 108 first commands right where the
    same names written bare gave 25 (docs/notes.md). Quotes of several words (a commit message, a
    command) keep their backticks, where they delimit something.
    """
    return _ONE_WORD_QUOTE.sub(r"\1", instruction)


def _write_task(task_dir: Path, spec: TaskSpec, category: str, split: str, seed: int) -> None:
    workspace = task_dir / "environment" / "workspace"
    workspace.mkdir(parents=True)
    (task_dir / "environment" / "Dockerfile").write_text(_DOCKERFILE)
    for relative, content in spec.files.items():
        path = workspace / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        os.chmod(path, spec.modes.get(relative, 0o644))
    for repo, message in spec.git_repos.items():
        _commit_all(workspace / repo, message)
    for relative, text in spec.uncommitted.items():
        (workspace / relative).write_text(text)
    (task_dir / "instruction.md").write_text(bare_names(spec.instruction).strip() + "\n")
    (task_dir / "task.toml").write_text(_task_toml(category, spec.difficulty, split, seed))
    _write_script(task_dir / "tests" / "test.sh", _test_script(spec.checks))
    _write_script(task_dir / "solution" / "solve.sh", f"#!/bin/bash\nset -e\ncd /workspace\n{spec.solution.strip()}\n")


def _write_script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _task_toml(category: str, difficulty: str, split: str, seed: int) -> str:
    return (
        'version = "1.0"\n\n[metadata]\n'
        f'category = "{category}"\ndifficulty = "{difficulty}"\nsplit = "{split}"\n'
        f'generator = "clawrl.envs.terminal.tasks v{GENERATOR_VERSION}"\nseed = {seed}\n\n'
        "[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 300.0\n\n"
        "[environment]\ncpus = 1\nmemory_mb = 1024\nstorage_mb = 256\nallow_internet = false\n"
    )


# A repository's own config and attributes are the agent's work: git run by a check would run the
# programs they name (core.fsmonitor, gpg.program with log.showSignature, filter and diff drivers).
# Every repository's config is replaced by git's defaults before the checks, one whose .git is not
# a plain directory of its own fails them, and git refuses a bare repository unless it is named
# explicitly (the agent could make one of a work tree's folder; safe.bareRepository, git >= 2.38).
_NEUTRAL_GIT = r"""export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 GIT_ATTR_NOSYSTEM=1
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.bareRepository GIT_CONFIG_VALUE_0=explicit
git_ok=1
while IFS= read -r -d '' git_dir; do
  if [ -d "$git_dir" ] && [ ! -L "$git_dir" ] && [ ! -e "$git_dir/commondir" ]; then
    printf '[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n' > "$git_dir/config"
  else
    git_ok=0
  fi
done < <(find . -name .git -print0 2>/dev/null)
"""


def _test_script(checks: list[str]) -> str:
    """The verifier: reward 1 when every check holds, else 0. The body is one `{ ...; exit; }` block,
    which bash reads whole before running any of it, so nothing written to the file meanwhile runs."""
    conditions = "\n".join(f"  {check} || return 1" for check in ["[ $git_ok = 1 ]", *checks])
    return (
        "#!/bin/bash\n# Reward 1 when every check holds, else 0 (Harbor: the reward goes to /logs/verifier/reward.txt).\n{\n"
        f"cd /workspace || exit 1\nmkdir -p \"$(dirname {REWARD_FILE})\"\n{_NEUTRAL_GIT}"
        f"checks() {{\n{conditions}\n}}\n"
        f"if checks >/dev/null 2>&1; then echo 1 > {REWARD_FILE}; else echo 0 > {REWARD_FILE}; fi\nexit 0\n}}\n"
    )


def _commit_all(repo: Path, message: str) -> None:
    """A repository with one commit of everything in `repo`; fixed identity and dates keep it reproducible."""
    stamp = "2024-01-01T00:00:00+0000"
    env = {**os.environ, "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp, "GIT_CONFIG_GLOBAL": os.devnull}
    identity = ["-c", "user.name=clawrl", "-c", "user.email=clawrl@example.com", "-c", "init.defaultBranch=main"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", message]):
        subprocess.run(["git", *identity, *command], cwd=repo, env=env, check=True, capture_output=True)


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _lines(rng: random.Random, words: Sequence[str], count: int) -> list[str]:
    return [f"{rng.choice(words)}-{rng.randint(10, 99)}" for _ in range(count)]


def tar_gz(members: dict[str, str]) -> bytes:
    """A gzipped tar of text files, with fixed times so that the bytes are reproducible."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue(), mtime=0)


def _file_equals(path: str, text: str) -> str:
    """A check that `path` holds exactly `text` (a trailing newline aside)."""
    return f'[ "$(cat {shlex.quote(path)})" = {shlex.quote(text.rstrip(chr(10)))} ]'


# --- files ------------------------------------------------------------------------------------------


def _mkdir_write(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    directory, name, word = rng.choice(words), f"{rng.choice(words)}.txt", rng.choice(words).upper()
    return TaskSpec(
        f"Create a directory `{directory}` in the workspace holding a file `{name}` whose only line is `{word}`.",
        [f"[ -d {directory} ]", _file_equals(f"{directory}/{name}", word)],
        f"mkdir -p {directory}\necho {word} > {directory}/{name}",
    )


def _move_logs(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    logs = [f"{word}.log" for word in rng.sample(words, rng.randint(2, 4))]
    others = [f"{word}.txt" for word in rng.sample(words, 2)]
    target = rng.choice(("logs", "archive", "old_logs"))
    files = {name: f"{name} line\n" for name in logs + others}
    checks = [f"[ -f {target}/{name} ] && [ ! -e {name} ]" for name in logs] + [f"[ -f {name} ]" for name in others]
    return TaskSpec(
        f"Move every `.log` file in the workspace into a new directory `{target}/`. Leave the other files where they are.",
        checks, f"mkdir -p {target}\nmv *.log {target}/", files,
    )


def _backup_copy(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    name = f"{rng.choice(words)}.conf"
    content = "\n".join(f"{key}={rng.randint(1, 999)}" for key in rng.sample(words, 4)) + "\n"
    return TaskSpec(
        f"Copy `{name}` to `backup/{name}.bak`, keeping the original in place.",
        [f"cmp -s {name} backup/{name}.bak", _file_equals(name, content)],
        f"mkdir -p backup\ncp {name} backup/{name}.bak", {name: content},
    )


def _count_files(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    count, nested = rng.randint(3, 9), rng.randint(1, 3)
    files = {f"data/file{i}.dat": f"{i}\n" for i in range(count)}
    files.update({f"data/sub/nested{i}.dat": "x\n" for i in range(nested)})
    return TaskSpec(
        "Write the number of regular files directly in `data/` (not counting files in its subdirectories) to "
        "`count.txt`, as a bare number.",
        [_file_equals("count.txt", str(count))], "find data -maxdepth 1 -type f | wc -l > count.txt", files,
    )


# --- text -------------------------------------------------------------------------------------------


def _sort_unique(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    names = [rng.choice(words) for _ in range(rng.randint(8, 14))]
    expected = "\n".join(sorted(set(names)))
    return TaskSpec(
        "Write the distinct lines of `names.txt`, sorted alphabetically, one per line, to `sorted.txt`.",
        [_file_equals("sorted.txt", expected)], "sort -u names.txt > sorted.txt", {"names.txt": "\n".join(names) + "\n"},
    )


def _count_errors(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    levels = [rng.choice(("INFO", "INFO", "WARN", "ERROR")) for _ in range(rng.randint(12, 30))]
    lines = [f"2024-01-01 10:{i:02d}:00 {level} {rng.choice(words)} event" for i, level in enumerate(levels)]
    word = rng.choice(("ERROR", "WARN"))
    return TaskSpec(
        f"Count the lines of `app.log` that contain `{word}` and write the number, alone, to `{word.lower()}s.txt`.",
        [_file_equals(f"{word.lower()}s.txt", str(levels.count(word)))],
        f"grep -c {word} app.log > {word.lower()}s.txt", {"app.log": "\n".join(lines) + "\n"},
    )


def _replace_in_configs(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    old, new = rng.sample(words, 2)
    names = rng.sample(words, 3)
    files = {f"config/{name}.conf": f"host={old}.local\nname={name}\nbackup={old}\n" for name in names}
    files["config/README"] = f"mentions {old} but is not a .conf file\n"
    checks = [f"! grep -q {old} config/{name}.conf && [ $(grep -c {new} config/{name}.conf) -eq 2 ]" for name in names]
    checks.append(f"grep -q {old} config/README")
    return TaskSpec(
        f"In every `.conf` file under `config/`, replace each occurrence of `{old}` with `{new}`. Do not change other files.",
        checks, f"sed -i 's/{old}/{new}/g' config/*.conf", files, difficulty="medium",
    )


def _csv_column(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    columns = ["id", "name", "city", "score"]
    rows = [[str(i), rng.choice(words), rng.choice(words).title(), str(rng.randint(1, 100))] for i in range(rng.randint(4, 8))]
    column = rng.choice(columns[1:])
    index = columns.index(column)
    table = "\n".join(",".join(row) for row in [columns, *rows]) + "\n"
    return TaskSpec(
        f"`people.csv` is comma-separated with a header line. Write the values of its `{column}` column (no header), "
        f"one per line in file order, to `{column}.txt`.",
        [_file_equals(f"{column}.txt", "\n".join(row[index] for row in rows))],
        f"tail -n +2 people.csv | cut -d, -f{index + 1} > {column}.txt", {"people.csv": table}, difficulty="medium",
    )


def _sum_numbers(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    numbers = [rng.randint(-50, 500) for _ in range(rng.randint(5, 15))]
    return TaskSpec(
        "`numbers.txt` holds one integer per line. Write their sum, alone, to `total.txt`.",
        [_file_equals("total.txt", str(sum(numbers)))],
        "python3 -c 'print(sum(int(l) for l in open(\"numbers.txt\")))' > total.txt",
        {"numbers.txt": "\n".join(map(str, numbers)) + "\n"},
    )


# --- permissions ------------------------------------------------------------------------------------


def _make_executable(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    name = f"{rng.choice(words)}.sh"
    word = rng.choice(words)
    content = f"#!/bin/bash\necho {word}\n"
    return TaskSpec(
        f"Make the script `{name}` executable by its owner, without changing its content.",
        # the content is compared, never run: a check must not execute what the agent wrote
        [f"[ $(( 0$(stat -c %a {name}) & 0100 )) -ne 0 ]", f"[ \"$(md5sum < {name} | cut -c1-32)\" = {_md5(content)} ]"],
        f"chmod u+x {name}", {name: content},
    )


def _private_file(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    name = f"{rng.choice(words)}.key"
    return TaskSpec(
        f"Set the permissions of `{name}` so that only its owner can read and write it, and nobody can execute it "
        "(mode 600).",
        [f"[ $(stat -c %a {name}) = 600 ]"], f"chmod 600 {name}", {name: f"{rng.getrandbits(64):x}\n"}, modes={name: 0o664},
    )


def _read_only_dir(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    names = [f"shared/{word}.txt" for word in rng.sample(words, rng.randint(2, 4))]
    return TaskSpec(
        "Make every file in `shared/` read-only for everyone: mode 444.",
        [f"[ $(stat -c %a {name}) = 444 ]" for name in names], "chmod 444 shared/*",
        {name: "data\n" for name in names}, modes={name: 0o664 for name in names},
    )


def _script_modes(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    scripts = [f"bin/{word}.sh" for word in rng.sample(words, 2)]
    others = [f"bin/{word}.md" for word in rng.sample(words, 2)]
    files = {name: "#!/bin/bash\ntrue\n" for name in scripts} | {name: "notes\n" for name in others}
    return TaskSpec(
        "In `bin/`, give every `.sh` file mode 755 and every other file mode 644.",
        [f"[ $(stat -c %a {name}) = 755 ]" for name in scripts] + [f"[ $(stat -c %a {name}) = 644 ]" for name in others],
        "chmod 644 bin/*\nchmod 755 bin/*.sh", files, modes={name: 0o600 for name in files}, difficulty="medium",
    )


# --- archives ---------------------------------------------------------------------------------------


def _create_tarball(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    directory, archive = rng.choice(("docs", "notes", "reports")), f"{rng.choice(words)}.tar.gz"
    files = {f"{directory}/{word}.md": f"# {word}\n" for word in rng.sample(words, 3)}
    checks = [f"tar -tzf {archive} | grep -qx {name}" for name in files]
    checks += [f"[ \"$(tar -xzOf {archive} {name})\" = '{text.strip()}' ]" for name, text in files.items()]
    return TaskSpec(
        f"Create a gzip-compressed tar archive `{archive}` of the directory `{directory}/` (paths inside the archive "
        f"start with `{directory}/`).",
        checks, f"tar -czf {archive} {directory}", files,
    )


def _extract_tarball(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    members = {f"{word}.txt": f"{rng.choice(words)}\n" for word in rng.sample(words, 3)}
    target = rng.choice(("out", "unpacked", "restore"))
    return TaskSpec(
        f"Extract the archive `bundle.tar.gz` into a new directory `{target}/`, so that its files are directly in "
        f"`{target}/`.",
        [_file_equals(f"{target}/{name}", text) for name, text in members.items()],
        f"mkdir -p {target}\ntar -xzf bundle.tar.gz -C {target}", {"bundle.tar.gz": tar_gz(members)},
    )


def _gzip_file(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    name = f"{rng.choice(words)}.csv"
    content = "\n".join(_lines(rng, words, 20)) + "\n"
    return TaskSpec(
        f"Compress `{name}` with gzip so that only `{name}.gz` remains (the uncompressed file is gone).",
        [f"[ ! -e {name} ]", f"[ \"$(gunzip -c {name}.gz | md5sum | cut -d' ' -f1)\" = {_md5(content)} ]"],
        f"gzip {name}", {name: content},
    )


def _archive_manifest(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    members = {f"{rng.choice(('src', 'lib'))}/{word}.py": "pass\n" for word in rng.sample(words, rng.randint(3, 5))}
    return TaskSpec(
        "Write the paths of the files in `release.tar.gz`, sorted alphabetically, one per line, to `manifest.txt`.",
        [_file_equals("manifest.txt", "\n".join(sorted(members)))], "tar -tzf release.tar.gz | sort > manifest.txt",
        {"release.tar.gz": tar_gz(members)},
    )


# --- git --------------------------------------------------------------------------------------------


def _git_init(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    message = f"Add {rng.choice(words)} project"
    names = [f"project/{word}.py" for word in rng.sample(words, 3)]
    return TaskSpec(
        f"Make `project/` a git repository and commit all of its files in a single commit with the message "
        f"`{message}`. {_GIT_IDENTITY}",
        ["[ $(git -C project rev-list --count HEAD) -eq 1 ]", f"[ \"$(git -C project log -1 --format=%s)\" = '{message}' ]",
         f"[ $(git -C project ls-files | wc -l) -eq {len(names)} ]", "[ -z \"$(git -C project status --porcelain)\" ]"],
        f"cd project\ngit init -q\ngit add -A\ngit -c user.name=agent -c user.email=agent@example.com commit -q -m '{message}'",
        {name: f"print('{name}')\n" for name in names}, difficulty="medium",
    )


def _git_branch(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    branch, name, word = f"feature/{rng.choice(words)}", f"{rng.choice(words)}.txt", rng.choice(words)
    return TaskSpec(
        f"In the git repository `repo/`, create a branch `{branch}` from `main` and commit on it a new file `{name}` "
        f"containing the line `{word}`. `main` must stay as it is. {_GIT_IDENTITY}",
        [f"[ \"$(git -C repo show {branch}:{name})\" = {word} ]", "[ $(git -C repo rev-list --count main) -eq 1 ]",
         f"[ $(git -C repo rev-list --count {branch}) -eq 2 ]"],
        f"cd repo\ngit checkout -q -b {branch}\necho {word} > {name}\ngit add {name}\n"
        f"git -c user.name=agent -c user.email=agent@example.com commit -q -m 'Add {name}'",
        {"repo/README.md": "# repo\n"}, git_repos={"repo": "Initial commit"}, difficulty="medium",
    )


def _git_commit_changes(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    name, message = f"{rng.choice(words)}.txt", f"Update {rng.choice(words)}"
    return TaskSpec(
        f"`repo/` is a git repository with uncommitted changes. Commit all of them (including the new file) with "
        f"the message `{message}`. {_GIT_IDENTITY}",
        [f"[ \"$(git -C repo log -1 --format=%s)\" = '{message}' ]", "[ -z \"$(git -C repo status --porcelain)\" ]",
         f"git -C repo cat-file -e HEAD:{name}"],
        f"cd repo\ngit add -A\ngit -c user.name=agent -c user.email=agent@example.com commit -q -m '{message}'",
        {"repo/main.txt": "first\n"}, git_repos={"repo": "Initial commit"},
        uncommitted={"repo/main.txt": "first\nsecond\n", f"repo/{name}": "new\n"}, difficulty="medium",
    )


def _git_tag(rng: random.Random, words: Sequence[str]) -> TaskSpec:
    tag = f"v{rng.randint(1, 9)}.{rng.randint(0, 9)}.{rng.randint(0, 9)}"
    return TaskSpec(
        f"Tag the latest commit of the git repository `repo/` as `{tag}`.",
        [f"[ \"$(git -C repo rev-parse {tag}^{{commit}})\" = \"$(git -C repo rev-parse HEAD)\" ]"],
        f"git -C repo tag {tag}", {"repo/app.py": "print('hi')\n"}, git_repos={"repo": "Initial commit"},
    )


_TEMPLATES: list[tuple[str, str, Callable[[random.Random, Sequence[str]], TaskSpec]]] = [
    ("files", "mkdir_write", _mkdir_write), ("files", "move_logs", _move_logs),
    ("files", "backup_copy", _backup_copy), ("files", "count_files", _count_files),
    ("text", "sort_unique", _sort_unique), ("text", "count_matches", _count_errors),
    ("text", "replace", _replace_in_configs), ("text", "csv_column", _csv_column), ("text", "sum_numbers", _sum_numbers),
    ("permissions", "make_executable", _make_executable), ("permissions", "private_file", _private_file),
    ("permissions", "read_only_dir", _read_only_dir), ("permissions", "script_modes", _script_modes),
    ("archives", "create_tarball", _create_tarball), ("archives", "extract_tarball", _extract_tarball),
    ("archives", "gzip_file", _gzip_file), ("archives", "manifest", _archive_manifest),
    ("git", "init_commit", _git_init), ("git", "branch", _git_branch),
    ("git", "commit_changes", _git_commit_changes), ("git", "tag", _git_tag),
]  # fmt: skip
