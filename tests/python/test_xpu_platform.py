"""The XPU side of the platform API and of the load-time choice, on a machine without an Intel GPU:
XPUGraphedForward differs from GraphedForward only in its device hooks, get_graphed_forward_cls
picks by platform, and graphed loads without the Level Zero test driver and says why XPU was
refused (and, with the driver through Debian's loader, says what it found)."""

import os
import subprocess
import sys
from pathlib import Path

import graphed
import pytest
import torch

# No native code of its own: XPUGraphedForward is GraphedForward with another default device
# (its one eager call takes the path test_graphed_cpu.py runs under the sanitizers), and the
# XPU probe needs a build with the XPU backend, which the sanitized one is not; the
# sanitized run (scripts/sanitize.sh) leaves it out.
pytestmark = pytest.mark.pure_python

ROOT = Path(__file__).resolve().parents[2]
# The test driver is a build product: under build/wheel (scripts/test.sh), build/ (plain CMake) or
# another build folder directly under build/. Only those are looked in: build/ may also hold a whole
# machine's file tree (scripts/fresh_machine.sh's chroot).
DRIVER = next(
    (
        path
        for pattern in ("build/tests/xpu/", "build/*/tests/xpu/")
        for path in sorted(ROOT.glob(pattern + "libgf_ze_test_driver.so"))
    ),
    ROOT / "build" / "tests" / "xpu" / "libgf_ze_test_driver.so",
)


def test_xpu_class_changes_only_device_hooks():
    own = {
        name
        for name, value in vars(graphed.XPUGraphedForward).items()
        if callable(value) or isinstance(value, staticmethod)
    }
    assert own == {"__init__"}
    assert issubclass(graphed.XPUGraphedForward, graphed.GraphedForward)
    assert graphed.CUDAGraphedForward is graphed.GraphedForward


def test_class_for_this_platform():
    name, _ = graphed.backend()
    cls = graphed.get_graphed_forward_cls()
    if name == "xpu":
        assert cls is graphed.XPUGraphedForward
    elif name == "cuda" or torch.cuda.is_available():
        assert cls is graphed.GraphedForward
    elif not torch.xpu.is_available():
        assert cls is graphed.GraphedForward


def test_xpu_forward_on_cpu_runs_eager():
    """On a device the backend cannot serve, the XPU class runs calls like the CUDA one."""
    forward = graphed.XPUGraphedForward(lambda *, x: x * 2, device="cpu")
    assert torch.equal(forward(x=torch.ones(3)), torch.full((3,), 2.0))
    assert forward.stats()["eager_calls"] == 1


def _backend_in_subprocess(env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZE_")}
    env.update(env_extra)
    code = "import graphed; print(graphed.backend())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _xpu_refusal_expected():
    name, reason = graphed.backend()
    if name != "none":
        pytest.skip(f"backend {name} is chosen here before XPU is probed")
    if "xpu:" not in reason:
        pytest.skip("this build has no XPU backend (no Level Zero headers)")


def test_without_the_test_driver_xpu_is_refused_with_a_reason():
    _xpu_refusal_expected()
    out = _backend_in_subprocess({})
    assert "xpu: " in out and ("no GPU driver" in out or "not installed" in out), out


def test_with_the_test_driver_the_loader_finds_the_device():
    _xpu_refusal_expected()
    if not DRIVER.exists():
        pytest.skip("the Level Zero test driver is not built")
    out = _backend_in_subprocess({"ZE_ENABLE_ALT_DRIVERS": str(DRIVER)})
    # This torch has no XPU, so the probe refuses after finding the device, and says so.
    assert "finds 1 GPU device(s)" in out and "torch has no XPU" in out, out
