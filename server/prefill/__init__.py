"""The prefill service: prompt + image embeddings (or raw images) -> first token + KV handle (P/D),
or a whole token stream (aggregated PD)."""
