"""Open a Snakemake report in a real browser: Debian's chromium, headless, driven by Selenium
through Debian's chromedriver (no driver download)."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
PACKAGES = ["chromium", "chromium-driver"]


def ensure_chromium() -> None:
    """Debian's chromium and chromium-driver, installed with apt when missing (CI runs as root);
    the test is skipped, saying why, where that cannot be done."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("needs Debian's chromium and chromium-driver: not installed, and no root apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", *PACKAGES]
    r = subprocess.run(install, capture_output=True, text=True, env=env, timeout=1200)
    if r.returncode != 0:  # stale package lists
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env, timeout=600)
        r = subprocess.run(install, capture_output=True, text=True, env=env, timeout=1200)
    assert r.returncode == 0 and CHROMIUM.exists() and CHROMEDRIVER.exists(), r.stdout[-2000:] + r.stderr[-2000:]


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)


#: Decode every image result of the report with the browser's own decoder: {path: [w, h]}.
DECODE_ALL = """
const done = arguments[arguments.length - 1];
const entries = Object.entries(results).filter(([k, v]) => v.mime_type.startsWith("image/"));
Promise.all(entries.map(([k, v]) => new Promise(resolve => {
  const img = new Image();
  img.onload = () => resolve([k, [img.naturalWidth, img.naturalHeight]]);
  img.onerror = () => resolve([k, [0, 0]]);
  img.src = v.data_uri;
}))).then(pairs => done(Object.fromEntries(pairs)));
"""


def _wait(cond, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    return cond()


def _shown(d):
    """The result on display: an image (its natural size) or an HTML table in the report's frame
    (its rows, read inside the frame)."""
    from selenium.webdriver.common.by import By

    size = d.execute_script("const im = Array.from(document.querySelectorAll('img'))"
                            ".filter(i => i.src.startsWith('data:image/png') && i.complete);"
                            "return im.length ? [im[0].naturalWidth, im[0].naturalHeight] : null;")
    if size:
        return {"kind": "image", "size": size}
    frames = d.find_elements(By.TAG_NAME, "iframe")
    if not frames:
        return None
    d.switch_to.frame(frames[0])
    try:
        rows = len(d.find_elements(By.TAG_NAME, "tr"))
    finally:
        d.switch_to.default_content()
    return {"kind": "html", "rows": rows} if rows else None


#: The landing page's geometry in the window: the verdict's left edge against the menu's right
#: edge, its widest line against the window, and the rule graph's top against the verdict's bottom.
LAYOUT = """
const doc = document.querySelector('div.document');
const nav = document.querySelector('nav');
const graph = document.getElementById('rulegraph');
if (!doc) return null;
const r = doc.getBoundingClientRect();
let right = r.right;
for (const e of doc.querySelectorAll('*')) right = Math.max(right, Math.min(e.getBoundingClientRect().right, 1e9));
return {doc_left: r.left, doc_right: right, doc_bottom: r.bottom, nav_right: nav ? nav.getBoundingClientRect().right : 0,
        window_width: window.innerWidth, graph_top: graph ? graph.getBoundingClientRect().top : null};
"""


def inspect_report(html: Path) -> dict:
    """What a person sees: the categories in the menu; every image decoded by the browser; for
    every category, its first result opened through the report's own menu (category, subcategory,
    the eye button) and what is then shown (an image's natural size, or an HTML table's rows);
    and the browser console's errors."""
    from selenium.webdriver.common.by import By

    d = browser()
    try:
        d.get(html.resolve().as_uri())
        _wait(lambda: d.find_elements(By.XPATH, "//*[text()='RESULTS' or text()='Results']"))
        categories = d.execute_script("return categories")
        menu = d.find_element(By.TAG_NAME, "body").text
        # where the landing page's title sits in the window (None: no verdict page)
        landing_top = d.execute_script("const h = [...document.querySelectorAll('h1')]"
                                       ".find(e => e.textContent.startsWith('Verdict'));"
                                       "return h ? h.getBoundingClientRect().top : null;")
        layout = d.execute_script(LAYOUT)
        decoded = d.execute_async_script(DECODE_ALL)
        shown = {}


        def click(elements):  # the element's own click handler (menu entries animate while they render)
            assert elements, "nothing to click"
            d.execute_script("arguments[0].click();", elements[0])

        for cat, subcats in categories.items():
            d.get("about:blank")
            d.get(html.resolve().as_uri())
            click(_wait(lambda cat=cat: d.find_elements(By.XPATH, f"//*[text()='{cat}']")))
            sub = next(iter(subcats))  # a single subcategory is not a menu level of its own
            if len(subcats) > 1:
                click(_wait(lambda sub=sub: d.find_elements(By.XPATH, f"//*[text()='{sub}']")))
            click(_wait(lambda: d.find_elements(By.CSS_SELECTOR, "a[iconname=eye]")))
            shown[cat] = _wait(lambda: _shown(d))
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        return {"categories": categories, "menu": menu, "landing_top": landing_top, "decoded": decoded, "shown": shown,
                "errors": errors, "layout": layout}
    finally:
        d.quit()
