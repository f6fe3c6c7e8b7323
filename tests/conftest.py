"""Fixtures shared by every test tier, and the tiers themselves.

- Tiers by folder: ``tests/unit`` (logic), ``tests/grpc`` (in-process servers on port 0) and
  ``tests/integration`` (real processes, vLLM engines, network namespaces), whose every test is
  marked ``integration`` here, so ``pytest -m "not integration"`` runs the first two alone.
- An error asyncio reports while a test runs (a task's exception nobody retrieved, a pending
  task destroyed, an exception in a callback) fails that test, as an exception in a finalizer
  does (pyproject.toml's filterwarnings).
- ``tiny_model_dir``: the tiny Qwen2-VL built once per session (or taken from EPD_TEST_MODEL_DIR).
- vLLM runs in-process where it can (VLLM_ENABLE_V1_MULTIPROCESSING=0), with its cache in a
  temporary folder, and the files it leaves in /tmp are removed at the end of the session.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="epd-tests-"))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CACHE_ROOT", str(_SESSION_TMP / "vllm-cache"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_INTEGRATION_DIR = Path(__file__).parent / "integration"
_VLLM_TMP_PATTERNS = ("/tmp/vllm_dist_*", "/tmp/vllm-*", "/tmp/*.ipc")


def _vllm_tmp_files() -> set[str]:
    return {path for pattern in _VLLM_TMP_PATTERNS for path in glob.glob(pattern)}


_PREEXISTING_TMP = _vllm_tmp_files()


def _is_a_live_engines(path: str) -> bool:
    """Whether ``path`` is the socket folder of another live process's vLLM engine
    (``vllm-rpc-<pid>-*``, made by VllmEngine.start): a session running beside this one."""
    match = re.search(r"/vllm-rpc-(\d+)-", path)
    if match is None or int(match[1]) == os.getpid():
        return False
    return os.path.exists(f"/proc/{match[1]}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-families",
        action="store_true",
        help="run the per-family real-process tests for every model family (CI runs a slice)",
    )
    parser.addoption(
        "--all-pythons",
        action="store_true",
        help="resolve the CUDA requirement set for the running and every supported Python "
        "(about a minute each, against PyPI; CI resolves none)",
    )


@pytest.hookimpl(tryfirst=True)  # NOTE: before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under ``tests/integration`` ``integration``."""
    for item in items:
        if item.path.is_relative_to(_INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove what vLLM left in /tmp during this session (not a live engine's sockets), and the
    session's own folder."""
    for path in _vllm_tmp_files() - _PREEXISTING_TMP:
        if _is_a_live_engines(path):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


class _ErrorRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(self.format(record))


@pytest.fixture(autouse=True)
def fail_on_asyncio_errors() -> Iterator[None]:
    """Fail the test if asyncio logs an error while it runs."""
    records = _ErrorRecords()
    logger = logging.getLogger("asyncio")
    logger.addHandler(records)
    try:
        yield
    finally:
        logger.removeHandler(records)
    if records.messages:
        pytest.fail("asyncio reported:\n" + "\n".join(records.messages), pytrace=False)


@pytest.fixture(scope="session")
def session_tmp() -> Path:
    """A folder that lives for the whole test session."""
    return _SESSION_TMP


@pytest.fixture(scope="session")
def tiny_model_dir() -> Iterator[Path]:
    """Path of the tiny test model, built once per session (seconds)."""
    preset_dir = os.environ.get("EPD_TEST_MODEL_DIR")
    if preset_dir:
        yield Path(preset_dir)
        return
    from epd.server.models.tiny.build import build_tiny_model

    yield build_tiny_model(_SESSION_TMP / "tiny-qwen2-vl")


@pytest.fixture(scope="session")
def tiny_family_dir() -> Callable[[str], Path]:
    """Builds (once per session) and returns the tiny checkpoint of a family by name; the
    default family's is ``tiny_model_dir``'s build."""
    from epd.server.models.tiny.build import build_tiny_model, preset

    built: dict[str, Path] = {}

    def build(family: str) -> Path:
        if family not in built:
            config = preset("tiny", family=family)
            built[family] = build_tiny_model(_SESSION_TMP / f"tiny-{family}", config)
        return built[family]

    return build
