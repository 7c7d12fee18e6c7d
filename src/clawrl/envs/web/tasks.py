"""The web tasks: which pages, their ids and splits, and the page image the browser opens them from.

Two kinds of task families:
- **MiniWoB++** (`MINIWOB_FAMILIES`): single-page tasks from the HTML files that the `miniwob`
  package ships (none of its Python is used). Each page draws its problem from `Math.random`,
  which the environment seeds with the task id, and computes its own reward in JavaScript. The
  families chosen are those whose reward is exact and that a scripted oracle solves from the
  text observation: buttons, links, a dialog, tabs, radio buttons, checkboxes, a text field, a
  password pair, a login form and a drop-down list.
- **forms** (`forms.py`): our multi-page forms; the task is drawn in Python from the task id.

A task id is `<family>-<instance>`: instances 0 to `EVAL_INSTANCES - 1` of every family are the
eval split, the next `TRAIN_INSTANCES` the train split, so eval asks for the same skills on
problems the training never saw.

The browser's sandbox sees one directory, the page image, at /workspace: MiniWoB's html folder
and the forms with their data.js, copied once under the cache directory (atomically, like the
terminal tasks), keyed by this module's `PAGES_VERSION` and the miniwob package's version.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clawrl.envs.protocol import Split
from clawrl.envs.web.forms import FORMS, data_js

PAGES_VERSION = 1  # bump when the forms change, so that caches of the old pages are not reused
EVAL_INSTANCES = 4
TRAIN_INSTANCES = 20
MINIWOB_FAMILIES = (
    "click-test-2", "click-button", "click-link", "click-dialog", "click-tab", "click-option", "click-checkboxes",
    "focus-text", "enter-text", "enter-password", "login-user", "choose-list",
)  # fmt: skip
FAMILIES = MINIWOB_FAMILIES + tuple(FORMS)
PAGES_ROOT = "/workspace"  # where the sandbox shows the page image


@dataclass(frozen=True)
class WebTask:
    """One task: a family's page and an instance of its problem."""

    id: str
    family: str
    split: Split

    @property
    def is_form(self) -> bool:
        return self.family in FORMS

    def page_url(self, relative: str) -> str:
        """The file:// URL of a page of the image, as the sandboxed browser sees it."""
        return f"file://{PAGES_ROOT}/{relative}"


def web_tasks(families: list[str], instances: range | None = None) -> dict[str, WebTask]:
    """Every task of `families` (every family when empty), by id; ValueError for an unknown family.

    `instances` (default: the eval and train splits') picks other instances, e.g. problems that
    neither split asks, for demonstrations: those outside the eval split's numbers are train tasks.
    """
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"no web task family {', '.join(unknown)}; the families are {', '.join(FAMILIES)}")
    tasks = {}
    for family in families or FAMILIES:
        for instance in instances or range(EVAL_INSTANCES + TRAIN_INSTANCES):
            task = WebTask(f"{family}-{instance}", family, "eval" if instance < EVAL_INSTANCES else "train")
            tasks[task.id] = task
    return tasks


def miniwob_html() -> Path:
    """The html folder the miniwob package ships (found without importing it: its import loads gymnasium)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the web environment needs the MiniWoB++ pages of the miniwob package: pip install miniwob==1.1.0")
    return Path(next(iter(spec.submodule_search_locations))) / "html"


def pages_dir(cache_dir: Path) -> Path:
    """The page image under `cache_dir`, written on first use."""
    target = cache_dir / "web-pages" / f"v{PAGES_VERSION}-miniwob{importlib.metadata.version('miniwob')}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    shutil.copytree(miniwob_html(), staging / "miniwob")
    shutil.copytree(Path(__file__).with_name("forms"), staging / "forms")
    (staging / "forms" / "data.js").write_text(data_js())
    staging.chmod(0o755)  # mkdtemp's 0700 would shut the sandbox's unmapped root out
    try:
        staging.rename(target)
    except OSError:  # another process finished first: its pages are the same
        shutil.rmtree(staging, ignore_errors=True)
    return target
