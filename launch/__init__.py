"""``epd up``: start a local deployment (every service as a child process) and watch it.

The launcher starts the services as ``python -m epd <service>`` processes and answers through the
SDK (``epd.client``); the SDK imports nothing of it, nor of ``epd.server``.
"""
