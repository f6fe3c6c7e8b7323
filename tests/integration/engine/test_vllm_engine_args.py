"""An engine argument epd has no flag of reaches vLLM's engine, and an overridden prompt limit
is the one the engine checks prompts against."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


async def test_engine_args_epd_does_not_name_change_the_started_engine(tiny_model_dir) -> None:
    from epd.server.engine.vllm_args import parse_engine_args
    from epd.server.engine.vllm_engine import VllmEngine
    from epd.server.engine.vllm_options import VllmOptions

    overrides = parse_engine_args(
        ["max_num_seqs=3", "enable_prefix_caching=false"], ["--max-model-len", "1024"]
    )
    options = VllmOptions(kv_cache_bytes=64 << 20, max_model_len=2048, overrides=overrides)
    engine = await VllmEngine.start(tiny_model_dir, options=options)
    try:
        config = engine._llm.vllm_config
        assert config.scheduler_config.max_num_seqs == 3
        assert config.cache_config.enable_prefix_caching is False
        assert config.model_config.max_model_len == 1024
        assert engine.options.max_model_len == 1024
    finally:
        await engine.close()
