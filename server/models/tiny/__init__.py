"""Tiny random-weight checkpoints, for ``epd model tiny`` and the tests: one builder per family
(``builder.TinyBuilder``, in a module named as the family's), found by the family's name
(``registry.builder_named``), and the shared build (``build.build_tiny_model``: tokenizer,
processor, weights, saved as the hub's). Serving never imports this package: a family's own
module says how to serve its checkpoints, the builder here how to make a tiny one.
"""
