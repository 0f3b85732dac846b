"""Why this exists: the one place that says which nvcc a build of graphed needs for a torch: one
of torch's exact CUDA "major.minor" (torch's own CMake config refuses any other), and, for CUDA 13
and newer, NVIDIA's nvcc wheels from PyPI of that release, which unpack beside torch
(site-packages/nvidia/cu<major>) where the build finds them. The README's install block, CMake's
message when it leaves the CUDA backend out and scripts/setup.sh all take the wheels and the
command from here (graphed._library, installed without this folder, keeps the same list for the
doctor's and the import's rebuild commands; tests/python/test_torch_pin.py checks that the two
agree), so they agree for a CUDA 13.0 torch and a CUDA 13.2 one alike.

It imports nothing of torch or of graphed (it runs before graphed is built, and torch's version is
read from its files); it runs as a script in a checkout:

    python install/nvcc_wheels.py              # the pins, one a line, for torch's CUDA
    python install/nvcc_wheels.py --command    # the whole pip command, or why there is none

With no torch, a torch without CUDA, or one of CUDA 12 or older (whose PyPI wheels have another
layout: set CUDA_HOME to a toolkit of that version instead), it prints no pins and says why on
stderr, so `... | xargs -r pip install` installs nothing there.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

# nvcc, the NVVM compiler it runs, the headers nvcc and torch's CUDA headers include (crt, cccl),
# and the runtime's headers and library (torch depends on this one too, of its own release).
WHEELS = (
    "nvidia-cuda-nvcc",
    "nvidia-nvvm",
    "nvidia-cuda-crt",
    "nvidia-cuda-cccl",
    "nvidia-cuda-runtime",
)
_RELEASE = re.compile(r"^(\d+)\.(\d+)")


def release(cuda: str | None) -> str | None:
    """'13.2' of a CUDA version string ('13.2', '13.2.51'); None for none or an unreadable one."""
    found = _RELEASE.match(cuda or "")
    return f"{found.group(1)}.{found.group(2)}" if found else None


def torch_cuda() -> str | None:
    """torch.version.cuda of the torch this Python would import, read from torch/version.py
    without importing torch (fast, and safe before graphed is built); None without torch or CUDA."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    found = re.search(r"^cuda\b[^=]*=\s*['\"]([0-9.]+)['\"]", text, re.M)
    return found.group(1) if found else None


def pins(cuda: str | None) -> list[str]:
    """The nvcc wheels' requirements for torch's CUDA `cuda` ('13.2' -> 'nvidia-cuda-nvcc==13.2.*',
    ...); empty where PyPI has none that the build uses (no CUDA, CUDA 12 or older)."""
    wanted = release(cuda)
    if wanted is None or int(wanted.split(".")[0]) < 13:
        return []
    return [f"{wheel}=={wanted}.*" for wheel in WHEELS]


def install_command(cuda: str | None, python: str | None = None) -> str | None:
    """The pip command that installs an nvcc of torch's CUDA `cuda` beside torch, through
    `python`'s pip (plain `pip` when None); None where PyPI has no such wheels."""
    wanted = pins(cuda)
    if not wanted:
        return None
    pip = f"{shlex.quote(python)} -m pip" if python else "pip"
    return f"{pip} install " + " ".join(shlex.quote(pin) for pin in wanted)


def why_none(cuda: str | None) -> str:
    """Why `pins(cuda)` is empty, and what to do instead."""
    if cuda is None:
        return "this torch has no CUDA (or there is no torch): no nvcc needed"
    return (
        f"torch has CUDA {cuda}: PyPI's nvcc wheels of CUDA 12 and older have another layout; "
        f"set CUDA_HOME to a CUDA {release(cuda) or cuda} toolkit before building graphed"
    )


def main(argv: list[str]) -> int:
    if argv not in ([], ["--command"]):
        print("usage: nvcc_wheels.py [--command]", file=sys.stderr)
        return 2
    cuda = torch_cuda()
    wanted = pins(cuda)
    if not wanted:
        print(f"graphed: {why_none(cuda)}", file=sys.stderr)
        return 0
    if argv == ["--command"]:
        print(install_command(cuda, sys.executable))
    else:
        print("\n".join(wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
