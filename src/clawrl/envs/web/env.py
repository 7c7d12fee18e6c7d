"""The web family: tasks in a real headless Chromium, the page as text, the browser driven by tool calls.

An episode opens the task's page (tasks.py) in a browser that runs in a sandbox of its own
(browser.py). The user message is the task's instruction followed by the page's listing
(page.py): its interactive elements, one a line, each with an id, a role, a label and its state.
Tools, each answered with what it did and the page's listing afterwards:

- `click(element)`: a real mouse click on the element (links, buttons, checkboxes, radios, ...);
- `type(element, text)`: replace the text of a field with `text`, typed key by key;
- `select(element, option)`: choose an option of a drop-down list, by its text;
- `key(name)`: press a key (Enter, Tab, Escape, arrows, ...) on the focused element;
- `screenshot()`, only with `--web-screenshots`: the viewport as a PNG data URL.

A call the page refuses (an id not on the page, a hidden or covered element, `select` on
something that is not a list, an unknown key) is answered with an error and the episode goes on.
The episode ends when the page's task is over (a MiniWoB page ended its episode; a form reached
its last page), when the model answers without a tool call, or at the step limit. Reward:
MiniWoB's own raw reward, negative values counted as 0 (1 for success, a fraction for the
partial credit some pages give), or the form's check (forms.py); 0 when the task never ended.

The browser lives across episodes: a reset opens a fresh page in it, about seven times cheaper
than starting one; `close()` kills it. A reset that finds the browser dead starts a new one.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from clawrl.config import EnvConfig
from clawrl.envs.episode import Outcome, Tool, ToolEnvironment
from clawrl.envs.protocol import Action, ChatMessage, Split
from clawrl.envs.web.browser import KEYS, ActionRefused, Browser, BrowserError
from clawrl.envs.web.forms import form_reward, form_task
from clawrl.envs.web.page import SNAPSHOT_JS, PageSnapshot, render
from clawrl.envs.web.tasks import WebTask, pages_dir, web_tasks

SYSTEM_PROMPT = (
    "You use a web browser. A page is shown as a list of its interactive elements, one a line: [id] role \"label\" "
    "and its state. Use the tools on the elements' ids: `click`, `type` (replaces the text of a field), `select` (an "
    "option of a list) and `key` (presses a key, e.g. Enter). Each tool answers with the page after the action. The "
    "episode ends when the task on the page is done."
)
_ELEMENT = {"type": "integer", "description": "The element's id, the number in brackets in the page's listing."}
_TOOL_PARAMETERS: dict[str, dict[str, Any]] = {
    "click": {"type": "object", "properties": {"element": _ELEMENT}, "required": ["element"]},
    "type": {
        "type": "object",
        "properties": {"element": _ELEMENT, "text": {"type": "string", "description": "The text to enter."}},
        "required": ["element", "text"],
    },
    "select": {
        "type": "object",
        "properties": {"element": _ELEMENT, "option": {"type": "string", "description": "The option's text."}},
        "required": ["element", "option"],
    },
    "key": {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": list(KEYS), "description": "The key to press."}},
        "required": ["name"],
    },
    "screenshot": {"type": "object", "properties": {}},
}
# MiniWoB pages end an episode on their own after 10 s; a model thinks longer than that. One day
# stays below setTimeout's 2^31 ms, past which the timer would fire at once.
_MINIWOB_START = """
Math.seedrandom(arguments[0]);
core.EPISODE_MAX_TIME = 24 * 3600 * 1000;
core.startEpisodeReal();
return core.getUtterance();
"""
# the listing and the task's status in one request (each WebDriver request costs tens of ms)
_OBSERVE = f"""
var page = (function () {{ {SNAPSHOT_JS} }}).apply(null, arguments);
if (typeof WOB_DONE_GLOBAL !== "undefined") {{
  return {{page: page, status: {{over: WOB_DONE_GLOBAL, reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON}}}};
}}
return {{page: page, status: {{over: window.clawrlResult !== undefined, submitted: window.clawrlResult || null}}}};
"""
# finds the option of a <select> whose text is arguments[1]; a string says why there is none
_FIND_OPTION = """
var list = document.querySelector('[data-clawrl-id="' + arguments[0] + '"]');
if (!(list instanceof HTMLSelectElement)) return "it is not a list";
var wanted = arguments[1].trim().toLowerCase();
for (var i = 0; i < list.options.length; i++) {
  if (list.options[i].text.trim().toLowerCase() === wanted) return list.options[i];
}
return "it has no option " + JSON.stringify(arguments[1]);
"""


class TaskStatus(BaseModel):
    """Whether the page's task is over, and with what: MiniWoB's raw reward, or the fields a form submitted."""

    over: bool = False
    reward: float | None = None
    reason: str | None = None
    submitted: dict[str, str] | None = None


class _Observed(BaseModel):
    page: PageSnapshot
    status: TaskStatus


class WebEnv(ToolEnvironment):
    """MiniWoB++ pages and our forms in a sandboxed headless Chromium."""

    name = "web"
    description = "MiniWoB++ tasks and multi-page forms in a sandboxed headless Chromium, the page as a list of elements"

    def __init__(self, config: EnvConfig | None = None, instances: range | None = None) -> None:
        """`instances`: which problems of each family are tasks (default: the eval and train splits')."""
        self.config = config or EnvConfig()
        super().__init__(self.config.max_steps)
        self._tasks = web_tasks(self.config.web_family_list(), instances)
        self._browser: Browser | None = None
        self._task: WebTask | None = None
        self._next_id = 1  # the id the next element seen for the first time gets, in this episode
        self._status = TaskStatus()  # as of the latest listing, which every action is answered with

    async def tasks(self, split: Split) -> list[str]:
        return [task.id for task in self._tasks.values() if task.split == split]

    async def reference_solution(self, task: str) -> str:
        """The task's family: the oracle solves each family by a script that reads the page's text."""
        return self._known(task).family

    async def close(self) -> None:
        browser, self._browser = self._browser, None
        if browser is not None:
            await browser.close()

    def _known(self, task: str) -> WebTask:
        if task not in self._tasks:
            raise ValueError(f"no web task {task!r}")
        return self._tasks[task]

    async def _open(self, task: str, seed: int) -> tuple[list[ChatMessage], list[Tool]]:
        self._task = self._known(task)
        self._next_id = 1
        if self._task.is_form:
            spec = form_task(self._task.family, self._task.id)
            await self._open_page(self._task.page_url(f"forms/{spec.start}"))
            instruction = spec.instruction
        else:
            await self._open_page(self._task.page_url(f"miniwob/miniwob/{self._task.family}.html"))
            instruction = str(await self._page().execute(_MINIWOB_START, self._task.id))
        opening = [
            ChatMessage(role="system", content=SYSTEM_PROMPT),
            ChatMessage(role="user", content=f"{instruction}\n\n{await self._listing()}"),
        ]
        return opening, self._offered_tools()

    async def _open_page(self, url: str) -> None:
        """Load `url` in the running browser, or in a new one when there is none or it died."""
        if self._browser is not None:
            try:
                await self._browser.open(url)
                return
            except BrowserError:
                await self.close()
        self._browser = await Browser.start(pages_dir(self.config.cache_dir), self.config.command_timeout_s)
        await self._browser.open(url)

    def _page(self) -> Browser:
        if self._browser is None:
            raise BrowserError("no browser: the environment was closed during the episode")
        return self._browser

    def _offered_tools(self) -> list[Tool]:
        tools = [
            Tool("click", "Click an element of the page.", _TOOL_PARAMETERS["click"], self._click),
            Tool("type", "Replace the text of a text field with the given text.", _TOOL_PARAMETERS["type"], self._type),
            Tool("select", "Choose an option of a drop-down list.", _TOOL_PARAMETERS["select"], self._select),
            Tool("key", "Press a key on the focused element.", _TOOL_PARAMETERS["key"], self._key),
        ]
        if self.config.web_screenshots:
            tools.append(Tool("screenshot", "See the page as a PNG image.", _TOOL_PARAMETERS["screenshot"], self._screenshot))
        return tools

    async def _listing(self) -> str:
        """The page's listing; the task's status is read with it."""
        observed = _Observed.model_validate(await self._page().execute(_OBSERVE, self._next_id))
        self._next_id, self._status = observed.page.next_id, observed.status
        return render(observed.page)

    async def _act(self, done: str, action: Callable[[], Awaitable[None]]) -> str:
        """Run one page action unless the task is over; what it did (or why not) and the page after it."""
        if self._status.over:
            return "error: the task is already over; nothing was done"
        try:
            await action()
        except ActionRefused as refusal:
            return f"error: {refusal}\n\n{await self._listing()}"
        return f"{done}\n\n{await self._listing()}"

    async def _element(self, element_id: int) -> dict[str, str] | None:
        return await self._page().find(f'[data-clawrl-id="{element_id}"]')

    async def _click(self, arguments: dict[str, Any]) -> str:
        element = await self._element(arguments["element"])
        if element is None:
            return await self._missing(arguments["element"])
        return await self._act(f"clicked [{arguments['element']}]", lambda: self._page().click(element))

    async def _type(self, arguments: dict[str, Any]) -> str:
        element = await self._element(arguments["element"])
        if element is None:
            return await self._missing(arguments["element"])
        done = f"typed {len(arguments['text'])} characters into [{arguments['element']}]"
        return await self._act(done, lambda: self._page().replace_text(element, arguments["text"]))

    async def _select(self, arguments: dict[str, Any]) -> str:
        option = await self._page().execute(_FIND_OPTION, arguments["element"], arguments["option"])
        if isinstance(option, str):
            return f"error: cannot select in [{arguments['element']}]: {option}\n\n{await self._listing()}"
        done = f"selected {arguments['option']!r} in [{arguments['element']}]"
        return await self._act(done, lambda: self._page().choose(option))

    async def _key(self, arguments: dict[str, Any]) -> str:
        if arguments["name"] not in KEYS:
            return f"error: no key {arguments['name']!r}; the keys are {', '.join(KEYS)}"
        return await self._act(f"pressed {arguments['name']}", lambda: self._page().press(arguments["name"]))

    async def _screenshot(self, _arguments: dict[str, Any]) -> str:
        return "data:image/png;base64," + base64.b64encode(await self._page().screenshot()).decode()

    async def _missing(self, element_id: int) -> str:
        return f"error: there is no element [{element_id}] on the page\n\n{await self._listing()}"

    async def _task_over(self) -> bool:
        return self._status.over

    async def _outcome(self, final: Action) -> Outcome:
        assert self._task is not None
        status = self._status
        if not status.over:
            return Outcome(0.0, {"task_over": False})
        if self._task.is_form:
            reward, wrong = form_reward(form_task(self._task.family, self._task.id).expected, status.submitted or {})
            return Outcome(reward, {"task_over": True, "wrong_fields": wrong})
        raw = status.reward or 0.0
        return Outcome(max(raw, 0.0), {"task_over": True, "miniwob_reward": raw, "miniwob_reason": status.reason})
