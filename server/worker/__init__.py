"""What the workers (encode, prefill, decode) share: registration with the scheduler."""
