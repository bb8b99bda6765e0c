"""The explanation view, rendered by a real headless browser (Chromium over the DevTools protocol):
the tokens it draws underlined are exactly the kept indices, the heat follows the scores; served by
POST /v1/explain over real HTTP and written by `ilre compress --explain`."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.service.conftest import free_port, http_client, wait_for

FACT = "The vault code of the museum is 4471. "
CONTEXT = "The grass is green. The sky is blue. " * 30 + FACT + "Here we go. There and back again. " * 30
QUERY = " What is the vault code of the museum? The vault code is"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)

RENDERED = """JSON.stringify({
  underlined: [...document.querySelectorAll('#context span[data-i]')]
      .filter(s => getComputedStyle(s).borderBottomStyle === 'solid' && s.getBoundingClientRect().width > 0)
      .map(s => +s.dataset.i),
  units: [...document.querySelectorAll('#context span.unit')].map(u => ({
      first: +u.querySelector('span[data-i]').dataset.i, bar: getComputedStyle(u).borderLeftWidth})),
  alpha: [...document.querySelectorAll('#context span[data-i]')].map(s => {
      const m = getComputedStyle(s).backgroundColor.match(/rgba?\\(([^)]*)\\)/)[1].split(',');
      return m.length === 4 ? +m[3] : 1; }),
  title: document.title, ready: document.readyState})"""


class Browser:
    """Headless Chromium driven over its DevTools websocket."""

    def __init__(self, tmp: Path):
        if CHROMIUM is None:
            pytest.skip("no chromium on PATH (`make tools` installs Debian's chromium when it runs as root)")
        self.port = free_port()
        self.proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      f"--remote-debugging-port={self.port}", f"--user-data-dir={tmp / 'profile'}",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._up, 60, "chromium's DevTools endpoint", interval=0.2)
        self._id = 0

    def _up(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/json/version", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def open(self, page: Path) -> dict:
        """Load the page; -> the rendered kept indices, background alphas and a screenshot's size."""
        target = httpx.put(f"http://127.0.0.1:{self.port}/json/new?{page.as_uri()}", timeout=10).json()
        with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
            # a new target starts on about:blank, already "complete": wait for *this* page's document
            loaded = f"location.href === {json.dumps(page.as_uri())} && document.readyState === 'complete'"
            give_up = time.monotonic() + 60
            while not self._call(ws, "Runtime.evaluate", expression=loaded):
                assert time.monotonic() < give_up, f"{page.name} did not load in 60 s"
                time.sleep(0.1)
            rendered = json.loads(self._call(ws, "Runtime.evaluate", expression=RENDERED))
            shot = self._call(ws, "Page.captureScreenshot", format="png")
        rendered["png_bytes"] = len(base64.b64decode(shot))
        return rendered

    def _call(self, ws, method: str, **params):
        self._id += 1
        if method == "Runtime.evaluate":
            params["returnByValue"] = True
        ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            reply = json.loads(ws.recv())
            if reply.get("id") == self._id:
                result = reply["result"]
                return result["result"]["value"] if method == "Runtime.evaluate" else result["data"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


def test_explain_page_over_http_shows_the_kept_tokens(local_service, browser, tmp_path, engine):
    with http_client(local_service) as http:
        reply = http.post("/v1/explain", json={"context": CONTEXT, "query": QUERY, "budget": 40})
        result = http.post("/v1/compress", json={"context": CONTEXT, "query": QUERY, "budget": 40}).json()
        refused = http.post("/v1/explain", json={"context": CONTEXT, "queries": [QUERY, QUERY]})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
    assert refused.status_code == 400 and refused.json()["field"] in ("explain", "queries")
    page = tmp_path / "explain.html"
    page.write_text(reply.text, encoding="utf-8")
    rendered = browser.open(page)
    assert rendered["underlined"] == result["kept_indices"]
    assert len(rendered["alpha"]) == result["original_tokens"] and rendered["png_bytes"] > 10_000
    fact = engine.tokenizer(CONTEXT[: CONTEXT.index("4471")], add_special_tokens=False).input_ids
    alpha = rendered["alpha"]
    assert alpha[len(fact)] > sorted(alpha)[len(alpha) // 2]  # the code's first digit is hotter than the median
    assert "4471" in result["compressed_context"]


def test_cli_writes_the_page_and_keeps_json_unchanged(browser, tmp_path):
    page = tmp_path / "cli.html"
    out = subprocess.run([sys.executable, "-m", "ilre.cli", "compress", "--context", CONTEXT, "--query", QUERY,
                          "--budget", "40", "--json", "--explain", str(page)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert "explanation" not in result
    assert browser.open(page)["underlined"] == result["kept_indices"]
    bad = subprocess.run([sys.executable, "-m", "ilre.cli", "compress", "--context", CONTEXT, "--query", QUERY,
                          "--explain", str(tmp_path / "no" / "such" / "dir.html")], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: explain: cannot write")


def test_explain_page_shows_units_and_which_were_kept_whole(browser, tmp_path, engine):
    from ilre.contract.messages import CompressRequest

    result = engine.compress(CompressRequest(context=CONTEXT, query=QUERY, budget=40, granularity="unit", explain=True))
    page = tmp_path / "units.html"
    page.write_text(result.explanation)
    drawn = browser.open(page)
    assert drawn["underlined"] == result.kept_indices
    bounds = engine.units(engine.names.slot("", result.document_id), engine._ids("context", CONTEXT, None, 1 << 20, "max_context_tokens")).bounds.tolist()
    assert [u["first"] for u in drawn["units"]] == bounds[:-1]  # a bar at the start of every unit
    kept = set(result.kept_indices)
    whole = [a for a, z in zip(bounds, bounds[1:]) if set(range(a, z)) <= kept]
    assert [u["first"] for u in drawn["units"] if u["bar"] == "3px"] == whole and whole
    assert FACT.strip() in "".join(CONTEXT[a:b] for a, b in result.kept_spans)  # the fact's sentence kept whole
    assert "granularity</td><td>unit" in result.explanation
