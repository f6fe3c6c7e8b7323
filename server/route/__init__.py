"""The route: the public entry that runs a chat request through encode, prefill and decode."""
