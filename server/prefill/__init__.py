"""The prefill service: prompt + image embeddings -> tokens (aggregated PD today)."""
