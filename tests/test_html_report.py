"""``report --html``: the page as a person sees it, rendered by a real headless Chromium
(Debian's chromium + chromedriver, driven by selenium; scripts/setup.sh installs them). The
test asserts on the DOM after layout: the table's rows, the token spans of the worst windows,
and a tooltip that appears only when the pointer is over its token. Its screenshot is written
to the test's directory (and, with KLDTOOL_SCREENSHOT=PATH, there too: docs/img/report_html.png
was taken so)."""

import os
import shutil

import pytest

from conftest import run_cli

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
needs_browser = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="no chromium/chromedriver on this machine (scripts/setup.sh installs Debian's as root)",
)


@pytest.fixture(scope="module")
def page(fixture_compares, tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    h5 = [fixture_compares / q / f"{q}.h5" for q in ("Q8_0", "Q2_K")]
    run_cli("report", *h5, "--html", d / "report.html", "--title", "SmolLM2 quants")
    html = (d / "report.html").read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html  # self-contained
    return d / "report.html"


@pytest.mark.quick
def test_the_page_stands_alone_and_names_each_quant(page):
    """Before any browser: the page the fixture wrote holds its table's two quants and nothing
    that fetches (asserted as it is written: no http(s) address, no script)."""
    html = page.read_text()
    assert "Q8_0" in html and "Q2_K" in html and "SmolLM2 quants" in html


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


@needs_browser
def test_report_page_in_a_real_browser(page, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    browser.get(page.as_uri())
    assert browser.title == "SmolLM2 quants"
    rows = browser.find_elements(By.CSS_SELECTOR, "#summary tbody tr")
    assert [r.find_element(By.TAG_NAME, "td").text for r in rows] == ["Q2_K", "Q8_0"]  # sorted by size
    assert "significant" in browser.find_element(By.CSS_SELECTOR, ".pairs li").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "img")) == 3
    assert all(img.get_property("naturalWidth") > 100 for img in browser.find_elements(By.CSS_SELECTOR, "img"))
    manifests = browser.find_elements(By.CSS_SELECTOR, "#manifests tbody tr")
    assert [len(m.find_elements(By.TAG_NAME, "td")) for m in manifests] == [10, 10]
    assert "AVX2" in manifests[0].text and "llamacpp" in manifests[0].text and "CPU" in manifests[0].text
    models = browser.find_elements(By.CSS_SELECTOR, "section.model")
    assert [m.find_element(By.TAG_NAME, "h3").text for m in models] == ["Q2_K", "Q8_0"]
    tokens = models[0].find_elements(By.CSS_SELECTOR, ".tok")
    assert len(tokens) == 2 * 63  # two worst windows of 63 scored tokens each
    worst = max(tokens, key=lambda t: float(t.get_attribute("data-kld")))
    tip = worst.find_element(By.CSS_SELECTOR, ".tip")
    assert not tip.is_displayed()
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", worst)
    ActionChains(browser).move_to_element(worst).perform()
    assert tip.is_displayed()
    text = tip.text
    assert "target" in text and "p_base" in text and "p_q" in text and "top-1 base" in text and "top-1 q" in text
    assert float(text.split("KLD ")[1].split()[0]) == pytest.approx(float(worst.get_attribute("data-kld")), rel=1e-4)
    shot = tmp_path / "report_html.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if os.environ.get("KLDTOOL_SCREENSHOT"):
        shutil.copy(shot, os.environ["KLDTOOL_SCREENSHOT"])


@pytest.fixture(scope="module")
def rolling_page(q4_1_gguf, requant, tmp_path_factory):
    """A rolling-protocol run (lm-eval's windows score from each document's first token), so its
    depth split has every bucket from position 1."""
    import json

    from conftest import WIKI

    d = tmp_path_factory.mktemp("html-rolling")
    wiki = WIKI.read_text(encoding="utf-8")
    docs = d / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": wiki[a : a + 1500]}) + "\n" for a in (0, 20000, 40000)))
    base = d / "rolling.kldt"
    run_cli("base", "-m", q4_1_gguf, "-f", docs, "--protocol", "rolling", "-c", 128, "--kl-divergence-base", base)
    run_cli("compare", "-m", requant("Q2_K"), "--kl-divergence-base", base, "--per-token", d / "Q2_K.h5")
    run_cli("report", d / "Q2_K.h5", "--html", d / "report.html", "--markdown", d / "report.md")
    return d


@needs_browser
def test_depth_and_kind_splits_of_a_rolling_run_in_a_real_browser(rolling_page, browser):
    import h5py
    from selenium.webdriver.common.by import By

    with h5py.File(rolling_page / "Q2_K.h5", "r") as f:
        n_tokens = len(f["kld"])
    browser.get((rolling_page / "report.html").as_uri())
    (section,) = browser.find_elements(By.CSS_SELECTOR, "section.split")
    assert section.find_element(By.TAG_NAME, "h3").text == "Q2_K"
    depth = section.find_element(By.CSS_SELECTOR, "table.breakdown[data-by=depth]")
    assert depth.is_displayed()
    cells = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in depth.find_elements(By.CSS_SELECTOR, "tbody tr")
    ]
    assert [c[0] for c in cells][:4] == ["1", "2-3", "4-7", "8-15"] and len(cells) >= 7
    assert sum(int(c[1]) for c in cells) == n_tokens
    kinds = section.find_element(By.CSS_SELECTOR, "table.breakdown[data-by=kind]")
    names = [tr.find_element(By.TAG_NAME, "td").text for tr in kinds.find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert "word start" in names and "punctuation" in names
    assert "by position in the window" in (rolling_page / "report.md").read_text()
