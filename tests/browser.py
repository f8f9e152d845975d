"""Headless Chromium for tests: open a page and ask it, through the DevTools protocol over a pipe
(--remote-debugging-pipe: NUL-separated JSON on file descriptors 3 and 4, so no websocket library is needed).

Chromium comes from Debian's packages (`apt-get install chromium`, /usr/bin/chromium; `make browser` installs it,
and `make test` runs `make browser` first). Where it is missing, `chromium_or_skip()` skips the test and names what
is missing (fails, in CI).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]


def chromium_or_skip() -> str:
    """The Chromium binary. Missing: the test is skipped, loudly, on a developer's machine; in CI (CI=true, where
    `make test` installs it first) it fails, so that a browser test never passes by not running."""
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    why = "no headless browser: Chromium is not installed (`make browser`, or `apt-get install chromium`)"
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


class Browser:
    """One Chromium process and one page in it."""

    def __init__(self, binary: str, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes its answers
            read, write = os.dup(to_browser_r), os.dup(from_browser_w)  # neither is 3 or 4 now
            os.dup2(read, 3)  # inheritable, unlike the pipe's own ends
            os.dup2(write, 4)

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire,
            close_fds=False,  # close_fds would close 3 and 4 after `wire` made them (the pipes are not inheritable)
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._id = 0
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]

    def call(self, method: str, *, session: bool = False, **params: Any) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            if time.monotonic() > deadline:
                raise TimeoutError(f"Chromium did not answer {method} in {self.timeout_s}s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited (code {self.proc.poll()}) while answering {method}")
            self._buffer += chunk

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"the page's script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.enable", session=True)
        self.call("Page.navigate", session=True, url=url)
        self.evaluate(
            "new Promise(r => { if (document.readyState === 'complete') r(true); "
            "else addEventListener('load', () => r(true)); })"
        )

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# What the report page says of its charts (inline <svg class="chart">, or <img>) once drawn: each SVG is serialized
# and loaded as an image of its own, which decodes only if it is a well-formed SVG document; then its natural and
# shown size, its data-points, whether it reaches outside the page, and its ink.
IMAGES_JS = """
Promise.all([...document.querySelectorAll("img, svg.chart")].map(async el => {
  let img = el;
  if (el instanceof SVGSVGElement) {
    img = new Image();
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(new XMLSerializer().serializeToString(el));
  }
  let decoded = true;
  try { await img.decode(); } catch (e) { decoded = false; }
  const box = el.getBoundingClientRect();
  const external = el instanceof SVGSVGElement
    ? el.querySelector("image, use, a, foreignObject, script, style") !== null
    : !el.src.startsWith("data:");
  return {id: el.id, tag: el.tagName.toLowerCase(), decoded, complete: img.complete, naturalWidth: img.naturalWidth,
          naturalHeight: img.naturalHeight, shownWidth: box.width, shownHeight: box.height,
          points: JSON.parse(el.dataset.points || "{}"), external, inked: inked(img)};
}))
"""

# The share of an image's pixels that are not (near) white: a chart that drew nothing is a blank canvas (a
# transparent pixel counts as ink: a chart must paint its own background). Prepended to IMAGES_JS, whose results
# carry it as `inked`.
INKED_JS = """
function inked(img) {
  if (!img.naturalWidth) return 0;
  const c = document.createElement("canvas");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext("2d");
  g.drawImage(img, 0, 0);
  const px = g.getImageData(0, 0, c.width, c.height).data;
  let ink = 0;
  for (let i = 0; i < px.length; i += 4) if (px[i] < 200 || px[i + 1] < 200 || px[i + 2] < 200) ink++;
  return ink / (px.length / 4);
}
"""
