"""The walk of an E/P/D request with one image through epd's own code (scripts/request_walk.py,
on the session's vLLM engines) stays within the files and functions docs/architecture.md lists:
a new hop, file or helper on the path shows here first."""

from __future__ import annotations

import pytest

from tests.unit.scripts.loader import load

pytestmark = pytest.mark.vllm

# The walk docs/architecture.md lists (the same in every run measured): a change that lengthens
# the path fails here, and goes into the document with its reason; one that shortens it lowers
# these.
MAX_FILES = 71
MAX_FUNCTIONS = 282


async def test_the_walk_stays_within_the_documented_path(
    tiny_model_dir, engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE: measured as scripts/request_walk.py and `epd up` run, with no span exporter: an
    # earlier test of the session may have installed one process-wide, which adds the HTTP
    # door's tracing middleware to the path.
    monkeypatch.setattr("epd.server.route.openai_http.traces_rpcs", lambda: False)
    request_walk = load("request_walk")
    recorder = request_walk.CallRecorder()
    recorder.install()
    try:
        async with request_walk.e_p_d(tiny_model_dir, *engines) as base_url:
            calls = await request_walk.walk(recorder, base_url)
    finally:
        recorder.uninstall()
    files = request_walk.by_file(calls)
    assert "server/route/router.py" in files and "server/decode/worker.py" in files, files
    assert len(files) <= MAX_FILES, sorted(files)
    assert len(calls) <= MAX_FUNCTIONS, (len(calls), files)
