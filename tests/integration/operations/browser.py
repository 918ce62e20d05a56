"""A headless Chromium (Debian's ``chromium``) driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: commands on fd 3, answers on fd 4, each a JSON message ended by a
NUL byte): what Puppeteer and Playwright do, in a page of code and no extra package.

    with Browser.launch(tmp_path) as browser:
        page = browser.open("http://127.0.0.1:8080/ui")
        page.wait_for("document.body.dataset.updates >= 2", timeout=30)
        data = page.evaluate("[...document.querySelectorAll('tr')].length")
        page.screenshot(tmp_path / "ui.png")
"""

import base64
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


class DevToolsError(RuntimeError):
    pass


class Browser:
    """One Chromium process and its DevTools pipe."""

    def __init__(self, process: subprocess.Popen[bytes], commands: int, answers: int) -> None:
        self.process = process
        self._out = os.fdopen(commands, "wb", buffering=0)
        self._in = os.fdopen(answers, "rb", buffering=0)
        self._next = 0
        self._answers: dict[int, dict[str, Any]] = {}
        self._ready = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    @contextmanager
    def launch(cls, scratch: Path, width: int = 1440, height: int = 1000) -> Iterator["Browser"]:
        """Start Chromium with a fresh profile under ``scratch``; stopped (by PID) on exit."""
        if not Path(CHROMIUM).exists():
            raise FileNotFoundError(f"{CHROMIUM}: Debian's chromium is not installed (make setup)")
        profile = scratch / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        to_child, commands = os.pipe()  # we write commands, Chromium reads fd 3
        answers, from_child = os.pipe()  # Chromium writes fd 4, we read answers

        def pipes() -> None:
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        process = subprocess.Popen(
            [
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(scratch / "chromium.log", "wb"),  # noqa: SIM115  (closed with the process)
            preexec_fn=pipes,
            pass_fds=(3, 4),
        )
        os.close(to_child)
        os.close(from_child)
        browser = cls(process, commands, answers)
        try:
            browser.send("Browser.getVersion")
            yield browser
        finally:
            browser.close()

    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = self._in.read(65536)
            if not chunk:
                break
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._ready:
                        self._answers[message["id"]] = message
                        self._ready.notify_all()
        with self._ready:
            self._ready.notify_all()

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Run one DevTools command; its result (raises its error)."""
        self._next += 1
        ident = self._next
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._ready:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    raise DevToolsError(f"{method}: no answer within {timeout:.0f}s")
                self._ready.wait(left)
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise DevToolsError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def open(self, url: str, width: int = 1440, height: int = 1000) -> "Page":
        """A new tab at ``url``."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        page = Page(self, session)
        page.call("Page.enable")
        page.call("Runtime.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        page.call("Page.navigate", {"url": url})
        return page

    def close(self) -> None:
        with suppress(DevToolsError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for stream in (self._out, self._in):
            with suppress(OSError):
                stream.close()


class Page:
    """One tab, through its DevTools session."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, poll_s: float = 0.25) -> Any:
        """Poll until the expression is truthy; its value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.evaluate(expression)
            except DevToolsError as exc:  # the page is still loading
                last = exc
            if last and not isinstance(last, Exception):
                return last
            time.sleep(poll_s)
        raise AssertionError(f"not true within {timeout:.0f}s: {expression} (last: {last!r})")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page."""
        shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path
