"""epd: disaggregated Encode / Prefill / Decode serving for vision-language models."""

__version__ = "0.1.0"
