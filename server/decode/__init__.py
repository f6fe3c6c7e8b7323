"""The decode service: continue generations whose KV cache a prefill worker computed."""
