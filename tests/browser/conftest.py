"""The browser suite: `llmfleet dev`'s processes (through `LocalPlatform`, on the test PostgreSQL and
Redis) and Debian's Chromium driven by Selenium through `/usr/bin/chromedriver` (no browser download).

Screenshots of every page go to `artifacts/console/` (gitignored; `LLMFLEET_ARTIFACTS` overrides).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from apps.cli.platform import MODEL_8B, LocalPlatform, NodeSpec, PlatformConfig
from tests.conftest import platform_stores

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,2000",
)  # fmt: skip

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def platform(
    pg_admin_url: str, redis_base_url: str, redis_test_db: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalPlatform]:
    with platform_stores(pg_admin_url, redis_base_url, redis_test_db, "llmfleet_test") as (db_url, redis_url):
        yield from _platform(db_url, redis_url, tmp_path_factory)


def _platform(
    db_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalPlatform]:
    tag = uuid.uuid4().hex[:6]  # pub/sub channels are shared by every Redis DB: unique node ids
    config = PlatformConfig(
        data_dir=tmp_path_factory.mktemp("console-platform"),
        gateway_port=0,
        nodes=[NodeSpec(f"b{tag}-8b-1", MODEL_8B, "onprem"), NodeSpec(f"b{tag}-8b-2", MODEL_8B, "cloud")],
        database_url=db_url,
        redis_url=redis_url,
        speed=20.0,
        gateway_env={"LLMFLEET_PG_POOL_MIN": "1", "LLMFLEET_PG_POOL_MAX": "6"},
        ready_timeout_s=90.0,
    )
    lp = LocalPlatform(config)
    lp.start()
    try:
        yield lp
    finally:
        lp.stop()


@pytest.fixture
def chrome(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        raise RuntimeError(
            "Debian's chromium and chromium-driver are required: apt-get install chromium chromium-driver"
        )
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never fetch a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    root = Path(os.environ.get("LLMFLEET_ARTIFACTS", "artifacts")) / "console"
    root.mkdir(parents=True, exist_ok=True)
    return root
