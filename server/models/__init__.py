"""Model families: the one room that names an architecture.

Each supported family is a ``ModelFamily`` (``family.py``) in a module of its own; ``registry.py``
recognises a checkpoint directory's family from its ``config.json``, and ``model_dir.py`` refuses
a service's model directory that holds none. ``tiny/`` builds a tiny random-weight checkpoint of
each family (``epd model tiny``, the tests), apart from serving, which never imports it. No module
outside this package names a family (see docs/models.md for how to add one).
"""
