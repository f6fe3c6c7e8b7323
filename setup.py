"""Map the repository's top-level folders under one import namespace.

server/ -> epd.server, common/ -> epd.common (what server, scheduler, client and launch share),
client/ -> epd.client (the SDK), launch/ -> epd.launch (`epd up`), scheduler/ -> epd.scheduler,
epd/ -> epd (epd/v1 holds the generated protobuf stubs). Everything else lives in
pyproject.toml; this file only exists because pyproject.toml cannot remap folders found by
package discovery.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "epd": "epd",
    "epd.server": "server",
    "epd.common": "common",
    "epd.client": "client",
    "epd.launch": "launch",
    "epd.scheduler": "scheduler",
}


def packages_under(namespace: str, folder: str) -> list[str]:
    return [namespace] + [f"{namespace}.{name}" for name in find_packages(folder)]


setup(
    packages=[name for ns, folder in FOLDERS.items() for name in packages_under(ns, folder)],
    package_dir={ns: folder for ns, folder in FOLDERS.items()},
    package_data={"epd.v1": ["*.pyi"]},
)
