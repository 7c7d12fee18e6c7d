"""A headless Chromium inside a sandbox, driven through chromedriver's W3C WebDriver HTTP API.

Debian's `chromium` and `chromium-driver` run in a `Sandbox` (fresh namespaces, loopback-only
network, the page image at /workspace): one `ShellSession` of it starts chromedriver and the
relay (relay.py) in the background, so the browser lives exactly as long as that session and
every process of it dies with the sandbox, also when the runner is SIGKILLed. chromedriver
listens on the sandbox's loopback, which the host cannot reach; the relay offers it on a Unix
socket in the sandbox's /tmp, which the host reaches through `Sandbox.socket_path` (the socket
pinned by descriptor, so nothing linked over it later is followed), and httpx speaks HTTP over it.

What Chromium needs from the sandbox:
- address space: Oilpan's caged heap and V8 reserve tens of GiB of virtual memory per process
  (a 64 GiB RLIMIT_AS makes it abort with "CagedHeap reservation"; 96 GiB was the least that
  worked), so `BROWSER_LIMITS` gives 256 GiB of address space per process; the memory actually
  used (360-370 MiB, docs/environments.md) is bounded by the sandbox's cgroup at 2 GiB;
- threads: about 130 threads in all with one page open, against RLIMIT_NPROC;
- CPU seconds: RLIMIT_CPU counts per process over the browser's whole life, and one browser
  serves many episodes;
- its own sandbox off (`--no-sandbox`: the namespaces are ours) and a fontconfig file, since the
  sandbox's /etc is generated without one (without fonts text would render as nothing).

Errors: `ActionRefused` when WebDriver refuses an action on the page (an element hidden,
covered, gone; the page is fine and the model may try something else); `BrowserError` when the
browser cannot go on (did not start, crashed, stopped answering): the episode fails.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from clawrl.envs.sandbox import Sandbox, SandboxError, SandboxLimits, sandbox_available

CHROMIUM = "/usr/lib/chromium/chromium"  # Debian's binary; /usr/bin/chromium is a wrapper script reading /etc
CHROMEDRIVER = "/usr/bin/chromedriver"
BROWSER_LIMITS = SandboxLimits(
    cpu_seconds=3600, memory_mb=2048, address_space_mb=256 * 1024, processes=512, cpus=2.0, disk_mb=512
)
CHROMIUM_ARGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
    "--disable-extensions", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-breakpad", "--mute-audio", "--window-size=800,600",
    "--force-device-scale-factor=1",
)  # fmt: skip
_PORT = 9515
_SOCKET = "/tmp/webdriver.sock"
_FONTS_CONF = "/tmp/fonts.conf"
_FONTS_CONF_TEXT = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>/usr/share/fonts</dir><cachedir>/tmp/fontconfig</cachedir></fontconfig>
"""
_DRIVER_LOG = "/tmp/chromedriver.log"
_ELEMENT_KEY = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference in JSON
# W3C errors about the page, not the browser: the action could not be done, the session is fine
_REFUSALS = {
    "element click intercepted", "element not interactable", "invalid element state", "no such element",
    "stale element reference", "move target out of bounds", "invalid argument",
}  # fmt: skip
# a point of arguments[0] where a click reaches it (or a child of it), in viewport pixels, or null
_VISIBLE_POINT = """
var element = arguments[0];
element.scrollIntoView({block: "nearest", inline: "nearest"});
var rect = element.getBoundingClientRect();
var fractions = [[0.5, 0.5]];
for (var i = 1; i < 8; i++) for (var j = 1; j < 8; j++) fractions.push([i / 8, j / 8]);
for (var k = 0; k < fractions.length; k++) {
  var x = Math.floor(rect.left + fractions[k][0] * rect.width), y = Math.floor(rect.top + fractions[k][1] * rect.height);
  var top = document.elementFromPoint(x, y);
  if (top !== null && (top === element || element.contains(top))) return [x, y];
}
return null;
"""
# WebDriver's code points for the keys `press` accepts (W3C WebDriver, "Keyboard actions")
KEYS = {
    "Enter": "\ue007", "Tab": "\ue004", "Escape": "\ue00c", "Backspace": "\ue003", "Delete": "\ue017",
    "Space": "\ue00d", "ArrowUp": "\ue013", "ArrowDown": "\ue015", "ArrowLeft": "\ue012", "ArrowRight": "\ue014",
    "Home": "\ue011", "End": "\ue010", "PageUp": "\ue00e", "PageDown": "\ue00f",
}  # fmt: skip


class BrowserError(Exception):
    """The browser cannot go on: it did not start, crashed or stopped answering."""


class ActionRefused(Exception):
    """WebDriver refused an action on the page (the message says why); the page is as it was."""


class _Reply(BaseModel):
    """Every WebDriver response body: `{"value": ...}`."""

    value: Any = None


class _Failure(BaseModel):
    """The value of a WebDriver error response."""

    error: str
    message: str = ""


def browser_unavailable() -> str | None:
    """None if a browser can start here, else why not (tests skip with it)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).exists()]
    if missing:
        return f"{' and '.join(missing)} missing (Debian: apt-get install chromium chromium-driver)"
    if shutil.which("python3", path="/usr/bin:/bin") is None:
        return "the sandbox needs /usr/bin/python3 for the WebDriver relay"
    return sandbox_available()


class Browser:
    """One Chromium with one page, in a sandbox of its own, over the page image at /workspace."""

    def __init__(self, sandbox: Sandbox, client: httpx.AsyncClient, session_path: str) -> None:
        self._sandbox = sandbox
        self._client = client
        self._session = session_path  # /session/<id>

    @classmethod
    async def start(cls, image: Path, timeout_s: float, limits: SandboxLimits = BROWSER_LIMITS) -> Browser:
        """A sandbox over `image`, chromedriver and Chromium in it; `timeout_s` bounds every request."""
        missing = browser_unavailable()
        if missing is not None:
            raise BrowserError(f"no browser here: {missing}")
        sandbox = Sandbox(image, limits)
        try:
            await sandbox.start()
            client = await _start_driver(sandbox, timeout_s)
            try:
                session = await _new_session(client, timeout_s)
            except BaseException:
                await client.aclose()
                raise
        except SandboxError as error:
            await sandbox.close()
            raise BrowserError(f"the browser's sandbox failed: {error}") from error
        except BaseException:
            await sandbox.close()
            raise
        return cls(sandbox, client, f"/session/{session}")

    async def close(self) -> None:
        """Kill the browser: its sandbox takes every process, mount and file with it."""
        await self._client.aclose()
        await self._sandbox.close()

    async def open(self, url: str) -> None:
        """Load `url` in the page and wait for it to load."""
        await self._command("POST", "/url", {"url": url})

    async def execute(self, script: str, *args: Any) -> Any:
        """Run `script` (a function body; `arguments` are `args`) in the page and return its value."""
        return await self._command("POST", "/execute/sync", {"script": script, "args": list(args)})

    async def find(self, css: str) -> dict[str, str] | None:
        """A reference to the first element matching `css`, or None."""
        try:
            found = await self._command("POST", "/element", {"using": "css selector", "value": css})
        except ActionRefused:
            return None
        return dict(found)

    async def click(self, element: dict[str, str]) -> None:
        """A real mouse click on the element (scrolled into view), as a user's. WebDriver's element
        click aims at the centre (and waits for a page the click loads); where another element
        covers the centre, a user clicks the part in sight: the first point of a grid over the
        element where it is on top. (Only the first waits for a page load: the pointer actions of
        the second do not, and no page of ours loads another from a covered element.)"""
        try:
            await self._command("POST", f"/element/{element[_ELEMENT_KEY]}/click", {})
        except ActionRefused as refusal:
            if not str(refusal).startswith("element click intercepted"):
                raise
            await self._click_visible_part(element)

    async def _click_visible_part(self, element: dict[str, str]) -> None:
        point = await self.execute(_VISIBLE_POINT, element)
        if point is None:
            raise ActionRefused("element click intercepted: other elements cover all of it")
        x, y = point
        presses = [{"type": "pointerMove", "x": x, "y": y, "origin": "viewport"},
                   {"type": "pointerDown", "button": 0}, {"type": "pointerUp", "button": 0}]  # fmt: skip
        mouse = {"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"}, "actions": presses}
        await self._command("POST", "/actions", {"actions": [mouse]})

    async def choose(self, option: dict[str, str]) -> None:
        """Choose an <option> of a drop-down list (WebDriver's element click: a list's options are
        drawn by the browser outside the page, out of a mouse's reach)."""
        await self._command("POST", f"/element/{option[_ELEMENT_KEY]}/click", {})

    async def replace_text(self, element: dict[str, str], text: str) -> None:
        """Empty an editable element, then type `text` into it key by key."""
        await self._command("POST", f"/element/{element[_ELEMENT_KEY]}/clear", {})
        await self._command("POST", f"/element/{element[_ELEMENT_KEY]}/value", {"text": text})

    async def press(self, key: str) -> None:
        """Press and release one key of `KEYS` on the focused element."""
        keystrokes = [{"type": "keyDown", "value": KEYS[key]}, {"type": "keyUp", "value": KEYS[key]}]
        await self._command("POST", "/actions", {"actions": [{"type": "key", "id": "keyboard", "actions": keystrokes}]})

    async def screenshot(self) -> bytes:
        """The page's viewport as a PNG."""
        return base64.b64decode(await self._command("GET", "/screenshot", None))

    async def _command(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        return await _call(self._client, method, self._session + path, body)


async def _call(client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None) -> Any:
    """One WebDriver request; its value, ActionRefused or BrowserError."""
    try:
        response = await client.request(method, path, json=body)
        reply = _Reply.model_validate_json(response.content)
    except (httpx.HTTPError, ValidationError) as error:
        raise BrowserError(f"the browser stopped answering ({type(error).__name__}: {error})") from error
    if response.is_success:
        return reply.value
    try:
        failure = _Failure.model_validate(reply.value)
    except ValidationError:
        raise BrowserError(f"WebDriver answered {response.status_code}: {response.text[:300]}") from None
    message = failure.message.split("\n")[0]  # the rest is chromedriver's build and stack
    if failure.error in _REFUSALS:
        raise ActionRefused(f"{failure.error}: {message}")
    raise BrowserError(f"WebDriver error {failure.error}: {message}")


async def _start_driver(sandbox: Sandbox, timeout_s: float) -> httpx.AsyncClient:
    """chromedriver and the relay, started in the background of a shell that keeps them; a client
    of chromedriver once it answers."""
    shell = await sandbox.shell()
    await sandbox.write_file(_FONTS_CONF, _FONTS_CONF_TEXT)
    relay = (Path(__file__).with_name("relay.py")).read_text()
    started = await shell.run(
        f"FONTCONFIG_FILE={_FONTS_CONF} {CHROMEDRIVER} --port={_PORT} >{_DRIVER_LOG} 2>&1 &\n"
        f"python3 -c {shlex.quote(relay)} {_SOCKET} {_PORT} >/tmp/relay.log 2>&1 &"
    )
    if started.exit_code != 0:
        raise BrowserError(f"chromedriver did not start: {started.stderr.strip()}")
    deadline = time.monotonic() + timeout_s
    socket_path = await _pinned_socket(sandbox, deadline)
    transport = httpx.AsyncHTTPTransport(uds=socket_path)
    # chromedriver refuses a Host header other than a local address (DNS rebinding protection)
    client = httpx.AsyncClient(transport=transport, base_url=f"http://localhost:{_PORT}", timeout=timeout_s)
    while True:
        try:
            if (await client.get("/status")).json()["value"]["ready"]:
                return client
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass  # chromedriver is not listening behind the relay yet
        if time.monotonic() > deadline:
            await client.aclose()
            raise BrowserError(f"chromedriver did not answer within {timeout_s:g} s: {await _driver_log(sandbox)}")
        await asyncio.sleep(0.02)


async def _pinned_socket(sandbox: Sandbox, deadline: float) -> str:
    """The relay's socket, pinned once it is there: what is later renamed or linked over it (a
    symlink to a host socket, say) is never followed (`Sandbox.socket_path`)."""
    while True:
        try:
            return sandbox.socket_path(_SOCKET)
        except SandboxError as error:
            if time.monotonic() > deadline:
                raise BrowserError(f"the WebDriver relay did not start: {error}; {await _driver_log(sandbox)}") from None
        await asyncio.sleep(0.02)


async def _driver_log(sandbox: Sandbox) -> str:
    return (await sandbox.run(f"tail -c 2000 {_DRIVER_LOG} /tmp/relay.log", cwd="/")).stdout.strip()


async def _new_session(client: httpx.AsyncClient, timeout_s: float) -> str:
    """Start Chromium (a WebDriver session); its session id."""
    milliseconds = int(timeout_s * 1000)
    capabilities = {
        "browserName": "chrome",
        "pageLoadStrategy": "normal",
        "unhandledPromptBehavior": "dismiss",  # an alert() left open must not block the next page
        "timeouts": {"implicit": 0, "pageLoad": milliseconds, "script": milliseconds},
        "goog:chromeOptions": {"binary": CHROMIUM, "args": list(CHROMIUM_ARGS)},
    }
    created = await _call(client, "POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})
    return str(created["sessionId"])
