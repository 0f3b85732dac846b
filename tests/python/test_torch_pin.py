"""What ties a build of graphed to one torch and one nvcc: the installed package requires exactly
the torch it was compiled against (install/torch_pin.py, run by the build before it compiles, so
pip never swaps that torch), an unsupported torch or none is refused there, and the nvcc wheels
named for a torch (install/nvcc_wheels.py, which the README's install block, CMake and setup.sh
use, and the doctor's own list) are of torch's exact CUDA major.minor, for a CUDA 13.0 torch and a
13.2 one alike."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from graphed import _doctor, _library

pytestmark = pytest.mark.pure_python

CHECKOUT = Path(__file__).resolve().parents[2]
EXPECT_INSTALLED = os.environ.get("GRAPHED_EXPECT_INSTALLED") == "1"


def _load(name: str):
    """install/<name>.py of the checkout, which is not installed with graphed."""
    spec = importlib.util.spec_from_file_location(name, CHECKOUT / "install" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torch_pin():
    return _load("torch_pin")


_nvcc_wheels = _load("nvcc_wheels")


@pytest.mark.skipif(not EXPECT_INSTALLED, reason="only when the suite runs against a wheel")
def test_the_installed_package_requires_exactly_the_running_torch():
    requires = [r for r in metadata.requires("graphed") or [] if r.startswith("torch")]
    assert requires == [f"torch=={metadata.version('torch')}"], requires
    assert metadata.version("torch").split("+")[0] == torch.__version__.split("+")[0]


def test_the_pin_names_the_torch_of_the_building_python():
    pin = _torch_pin()
    assert pin.dynamic_metadata("dependencies", {}) == [f"torch=={metadata.version('torch')}"]
    with pytest.raises(RuntimeError, match="'dependencies' only"):
        pin.dynamic_metadata("version", {})


@pytest.mark.parametrize(
    ("version", "supported"),
    [("2.10.2", False), ("2.11.0", True), ("2.14.1", True), ("2.15.0+cu132", True),
     ("2.16.0", False), ("2.16.0.dev20261201+cu132", False), ("nightly", False)],
)  # fmt: skip
def test_an_unsupported_torch_is_refused_before_the_build(monkeypatch, version, supported):
    pin = _torch_pin()
    monkeypatch.setattr(pin.metadata, "version", lambda name: version)
    if supported:
        assert pin.torch_requirement() == f"torch=={version}"
        return
    with pytest.raises(RuntimeError) as raised:
        pin.torch_requirement()
    said = str(raised.value)
    assert f"this environment has torch {version}" in said
    assert "supports torch 2.11 to 2.15" in said and "nothing was compiled" in said
    assert "pip install 'torch>=2.11,<2.16'" in said


def test_no_torch_is_refused_with_the_way_to_build(monkeypatch):
    pin = _torch_pin()
    monkeypatch.setattr(pin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install --no-build-isolation"):
        pin.torch_requirement()


@pytest.mark.parametrize("cuda", ["13.0", "13.2", "13.2.1"])
def test_the_nvcc_wheels_are_of_torchs_exact_cuda_release(cuda):
    release = ".".join(cuda.split(".")[:2])
    pins = _nvcc_wheels.pins(cuda)
    assert pins[0] == f"nvidia-cuda-nvcc=={release}.*"
    assert all(pin.endswith(f"=={release}.*") for pin in pins), pins
    assert {"nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl"} <= {
        pin.split("==")[0] for pin in pins
    }
    command = _nvcc_wheels.install_command(cuda, "/x/python")
    assert command == "/x/python -m pip install " + " ".join(f"'{pin}'" for pin in pins)


@pytest.mark.parametrize("cuda", [None, "12.8", "11.8"])
def test_no_nvcc_wheels_where_pypi_has_none_the_build_uses(cuda):
    assert _nvcc_wheels.pins(cuda) == []
    assert _nvcc_wheels.install_command(cuda) is None
    assert ("CUDA_HOME" in _nvcc_wheels.why_none(cuda)) == (cuda is not None)


def test_the_script_prints_the_pins_of_the_running_torch():
    script = CHECKOUT / "install" / "nvcc_wheels.py"
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=60
    )
    assert run.stdout.split() == _nvcc_wheels.pins(torch.version.cuda)
    if not _nvcc_wheels.pins(torch.version.cuda):
        assert "graphed:" in run.stderr


def test_the_doctor_asks_for_torchs_release_not_another_of_its_major(monkeypatch, tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    monkeypatch.setattr(_doctor, "nvcc_candidates", lambda torch_dir, major: [nvcc])
    monkeypatch.setattr(_doctor, "_nvcc_release", lambda found: "13.0")
    why, fix = _doctor.cuda_left_out("13.2", (), tmp_path)
    assert "no nvcc of CUDA 13.2 was found" in why
    assert f"only {nvcc} (CUDA 13.0)" in why
    assert "'nvidia-cuda-nvcc==13.2.*'" in fix and "13.0.*" not in fix
    assert "--no-build-isolation --force-reinstall --no-deps" in fix
    # The same machine with a CUDA 13.0 torch: that nvcc fits, and only a rebuild is asked for.
    why, fix = _doctor.cuda_left_out("13.0", (), tmp_path)
    assert f"but one is here now: {nvcc} (CUDA 13.0)" in why
    assert "nvidia-cuda-nvcc" not in fix


@pytest.mark.parametrize("cuda", ["13.0", "13.2", "12.8"])
def test_graphed_names_the_same_wheels_as_the_build(cuda):
    python = sys.executable
    assert _library.nvcc_wheels_command(cuda, python) == _nvcc_wheels.install_command(cuda, python)
