"""What the workers share: registration with the scheduler (encode, prefill, decode), and what
prefill and decode both build on (request conversion, image inputs, an engine served as a
worker)."""
