"""Make PyPI's torchvision importable beside a CPU-only torch (run by scripts/install.sh).

Why: torchvision 0.28.0 on PyPI is built against the CUDA torch. Beside the CPU torch its C
extension (_C.so) fails to load because libc10_cuda.so is missing; torchvision tolerates that,
except in torchvision/_meta_registrations.py, where two decorators,
``@torch.library.register_fake("torchvision::nms")`` and ``...("torchvision::qnms")``, are not
guarded by ``extension._has_ops()`` like the rest of that file and raise
"operator torchvision::nms does not exist" at import time. transformers' and vLLM's image
processors import torchvision, so the whole stack fails.

Fix: guard exactly those two decorators the same way the rest of the file is guarded. The
patch is idempotent, checks that it matched, and does nothing when torchvision already
imports (e.g. a CUDA machine with a matching torch, or a future fixed torchvision).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

UNGUARDED = re.compile(r'^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$', re.MULTILINE)
GUARDED = (
    '@(torch.library.register_fake("torchvision::\\1") '
    "if torchvision.extension._has_ops() else (lambda fn: fn))"
)


def torchvision_imports() -> bool:
    """Return True when ``import torchvision`` succeeds in a fresh interpreter."""
    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True)
    return probe.returncode == 0


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("patch_torchvision: torchvision not installed, nothing to do")
        return 0
    if torchvision_imports():
        print("patch_torchvision: torchvision imports cleanly, nothing to do")
        return 0
    target = Path(spec.origin).parent / "_meta_registrations.py"
    source = target.read_text()
    patched, count = UNGUARDED.subn(GUARDED, source)
    if count == 0:
        print(f"patch_torchvision: expected decorators not found in {target}", file=sys.stderr)
        return 1
    target.write_text(patched)
    if not torchvision_imports():
        print("patch_torchvision: torchvision still fails to import", file=sys.stderr)
        return 1
    print(f"patch_torchvision: guarded {count} decorators in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
