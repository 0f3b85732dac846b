"""The installed package: its version metadata, the build info it records, the readable
ImportErrors of a torch mismatch and of a never-built checkout, the doctor (`python -m graphed`),
that importing it changes none of the global state it may change later, and, when
scripts/test.sh runs the suite against a wheel (GRAPHED_EXPECT_INSTALLED=1), that the package
really is the installed one and that its native files carry no path of the build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import graphed
import pytest
import torch
from graphed import _doctor, _library

# No native code of its own: metadata, the doctor's words and fresh interpreters that import
# graphed (a load every sanitized test does too; the children that clear PYTHONPATH import
# the installed wheel, not the sanitized build); the sanitized run (scripts/sanitize.sh)
# leaves it out.
pytestmark = pytest.mark.pure_python

CHECKOUT = Path(__file__).resolve().parents[2]
EXPECT_INSTALLED = os.environ.get("GRAPHED_EXPECT_INSTALLED") == "1"


def _build_info():
    try:
        from graphed import _build_info
    except ImportError:
        if EXPECT_INSTALLED:
            raise
        pytest.skip("this graphed has no _build_info (not a pip or cmake --install build)")
    return _build_info


def _child_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHED_LIBRARY", "PYTHONPATH")}
    env.update(extra)
    return env


def test_version_is_one_string_everywhere():
    assert re.fullmatch(r"\d+\.\d+\.\d+", graphed.__version__)
    source = (CHECKOUT / "python" / "graphed" / "_version.py").read_text()
    assert f'__version__ = "{graphed.__version__}"' in source
    assert _build_info().version == graphed.__version__
    try:
        assert metadata.version("graphed") == graphed.__version__
    except metadata.PackageNotFoundError:
        if EXPECT_INSTALLED:
            raise
        pytest.skip("graphed is not installed (imported from a tree)")


def test_build_info_matches_running_torch():
    info = _build_info()
    assert info.torch_version.split("+")[0] == str(torch.__version__).split("+")[0]
    assert (info.torch_cuda or None) == (torch.version.cuda or None)
    assert set(info.backends) <= {"cuda", "xpu"}
    assert _library.torch_mismatch(info.torch_version, info.torch_cuda) is None


def test_torch_mismatch_is_one_readable_import_error(monkeypatch):
    info = _build_info()
    monkeypatch.setattr(info, "torch_version", "2.11.0+cu128")
    monkeypatch.setattr(info, "torch_cuda", "12.8")
    monkeypatch.setattr(_library, "_checked", False)
    monkeypatch.delenv("GRAPHED_SKIP_TORCH_CHECK", raising=False)
    with pytest.raises(ImportError) as caught:
        _library.check_build()
    message = str(caught.value)
    assert "2.11.0+cu128" in message and str(torch.__version__) in message
    assert "pip install --no-build-isolation" in message and "--force-reinstall" in message
    monkeypatch.setenv("GRAPHED_SKIP_TORCH_CHECK", "1")
    _library.check_build()  # the escape hatch


def test_the_rebuild_command_installs_its_build_backend_first():
    # A --no-build-isolation build does not fetch scikit-build-core, and the environment may never
    # have had it: the command installs it first, through the pip of the Python that runs torch.
    why = _library.torch_mismatch("2.11.0+cu128", "12.8")
    backend, build = why.split("Rebuild it against the running torch: ", 1)[1].split(" && ")
    pip, installs = backend.split(" install scikit-build-core")
    assert pip.endswith(" -m pip")
    # With the backend, the nvcc wheels of the running torch's exact CUDA release (a 13.2 torch
    # needs a 13.2 nvcc, which the old build's wheels are not).
    cuda = torch.version.cuda
    if cuda and int(cuda.split(".")[0]) >= 13:
        release = ".".join(cuda.split(".")[:2])
        assert f"'nvidia-cuda-nvcc=={release}.*'" in installs, installs
    else:
        assert installs == "", installs
    assert build.startswith(f"{pip} install --no-build-isolation ")
    assert build.endswith(" --force-reinstall --no-deps")


def test_never_built_tree_says_how_to_build(tmp_path):
    tree = tmp_path / "python" / "graphed"
    tree.mkdir(parents=True)
    for source in Path(graphed.__file__).parent.glob("*.py"):
        if source.name != "_build_info.py":
            shutil.copy(source, tree / source.name)
    result = subprocess.run(
        [sys.executable, "-c", "import graphed"],
        cwd=tmp_path,
        env=_child_env(PYTHONPATH=str(tmp_path / "python")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "graphed's native library is not built; " in result.stderr
    # The build backend first, with the nvcc wheels of the running torch's CUDA release, if any.
    assert re.search(r" -m pip install scikit-build-core( '[^' ]+')* && ", result.stderr), (
        result.stderr
    )
    assert "No module named" not in result.stderr


# What graphed may replace while it runs, each read in a fresh interpreter before and after.
_GLOBAL_STATE = """
import torch, warnings
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

def state():
    return [
        dist.destroy_process_group,
        c10d.destroy_process_group,
        torch.cuda.is_current_stream_capturing,
        torch.cuda.graphs.is_current_stream_capturing,
        warnings.showwarning,
        list(warnings.filters),
        torch.utils.swap_tensors,
    ]

before = state()
"""


def _in_fresh_interpreter(program: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _GLOBAL_STATE + program],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_importing_graphed_or_making_a_runner_changes_no_global_state():
    # Importing patches nothing; nor does a runner without a group on the CPU (torch's
    # is_current_stream_capturing is wrapped by the first CUDA runner, destroy_process_group by
    # the first runner with a group: docs/architecture.md lists each change and its undoing).
    _in_fresh_interpreter(
        "import graphed\n"
        "assert state() == before, (before, state())\n"
        "gf = graphed.GraphedForward(lambda *, x: x + 1, device='cpu')\n"
        "assert bool((gf(x=torch.ones(2)) == 2).all())\n"
        "assert state() == before, (before, state())\n"
    )


def test_the_first_watched_module_wraps_swap_tensors_and_nothing_else():
    # A GraphedForward of an nn.Module arms the watch, whose first arming counts swaps
    # (graphed._watch.count_swaps); the global-state table lists it.
    _in_fresh_interpreter(
        "import sys, graphed\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from _backend_choice import load_emulated\n"
        "gf = graphed.GraphedForward(\n"
        "    torch.nn.Linear(2, 2), device='cpu', backend=load_emulated()\n"
        ")\n"
        "gf(input=torch.ones(1, 2))\n"
        "after = state()\n"
        "assert after[-1] is not before[-1] and after[-1].__wrapped__ is before[-1]\n"
        "assert after[:-1] == before[:-1], (before, after)\n"
    )


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")
def test_the_first_runner_with_a_group_wraps_destroy_process_group():
    _in_fresh_interpreter(
        "import graphed\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "gf = graphed.GraphedForward(lambda *, x: x + 1, device='cpu', group=dist.group.WORLD)\n"
        "wrapped = dist.destroy_process_group\n"
        "assert wrapped is not before[0] and wrapped.__graphed_original__ is before[0]\n"
        "assert c10d.destroy_process_group is wrapped\n"
        "dist.destroy_process_group()\n"
        "assert gf.group is None and not gf.stats()['enabled']  # released first\n"
    )


def _doctor_run(tmp_path: Path, *arguments: str, pythonpath: str | None = None):
    if pythonpath is None:
        pythonpath = os.environ.get("PYTHONPATH")
    return subprocess.run(
        [sys.executable, "-m", "graphed", *arguments],
        cwd=tmp_path,
        env=_child_env(**({"PYTHONPATH": pythonpath} if pythonpath else {})),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_doctor_reports_and_passes(tmp_path):
    result = _doctor_run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for label in ("torch ", "built for torch", "backends built in", "backend at load", "pass:"):
        assert label in result.stdout
    assert graphed.__version__ in result.stdout


def test_doctor_prints_the_backends_reason_once_in_words(tmp_path):
    result = _doctor_run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    said = result.stdout + result.stderr
    reason = _doctor.in_words(torch.ops.graphed.backend()[1])
    assert said.count(reason) == 1, said
    assert "(result 0x" not in said
    verbose = _doctor_run(tmp_path, "--verbose").stdout
    assert torch.ops.graphed.backend()[1] in verbose


def _numpy_hidden(tmp_path: Path) -> str:
    """A PYTHONPATH on which `import numpy` fails as it does where NumPy is not installed, so
    that torch warns at its import ("Failed to initialize NumPy: ...")."""
    folder = tmp_path / "without_numpy"
    (folder / "numpy").mkdir(parents=True)
    (folder / "numpy" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'numpy\' (hidden)", name="numpy")\n'
    )
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def test_doctor_reports_torchs_numpy_warning_as_a_line_not_its_opening(tmp_path):
    pythonpath = _numpy_hidden(tmp_path)
    result = _doctor_run(tmp_path, pythonpath=pythonpath)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("graphed doctor\n"), result.stdout
    assert "NumPy" not in result.stderr, result.stderr
    numpy_line = [line for line in result.stdout.splitlines() if line.split()[:1] == ["numpy"]]
    assert len(numpy_line) == 1, result.stdout
    assert "Failed to initialize NumPy: No module named 'numpy' (hidden)" in numpy_line[0]
    assert "Triggered internally" not in numpy_line[0]
    # Only the doctor: a program importing graphed gets torch's warning as torch gives it.
    program = subprocess.run(
        [sys.executable, "-c", "import graphed"],
        cwd=tmp_path,
        env=_child_env(PYTHONPATH=pythonpath),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert program.returncode == 0, program.stderr
    assert "UserWarning: Failed to initialize NumPy" in program.stderr, program.stderr


def test_in_words_drops_a_drivers_raw_result_code():
    raw = "xpu: the Level Zero loader found no GPU driver (result 0x78000001)"
    assert _doctor.in_words(raw) == "xpu: the Level Zero loader found no GPU driver"
    assert _doctor.in_words(raw, verbose=True) == raw


def test_doctor_help_is_whole_and_ends_with_a_full_sentence(capsys):
    with pytest.raises(SystemExit) as caught:
        _doctor.main(["--help"])
    assert caught.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert _doctor._DESCRIPTION in text
    assert text.endswith(_doctor._EPILOG) and text.endswith(".")


def test_doctor_reports_an_install_that_cannot_load(capsys):
    why = "graphed was built for torch 2.11.0+cu128 (CUDA 12.8) but this Python runs torch X"
    assert _doctor.report_unusable_install(ImportError(why)) == 1
    out = capsys.readouterr().out
    assert f"graphed cannot load: {why}" in out
    assert "then run `python -m graphed` again" in out


def test_only_the_doctor_turns_the_import_error_into_its_report(monkeypatch, capsys):
    error = ImportError("graphed was built for another torch")
    monkeypatch.setattr(sys, "argv", ["-m"])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "graphed"])
    with pytest.raises(SystemExit) as caught:
        _doctor.exit_if_doctor(error)
    assert caught.value.code == 1
    assert "graphed cannot load: graphed was built for another torch" in capsys.readouterr().out
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "pytest"])
    assert _doctor.exit_if_doctor(error) is None  # the import then raises as before
    monkeypatch.setattr(sys, "argv", ["script.py"])
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "graphed"])
    assert _doctor.exit_if_doctor(error) is None


def test_doctor_reports_a_torch_mismatch_without_a_traceback(tmp_path):
    _build_info()
    package = tmp_path / "site" / "graphed"
    shutil.copytree(
        Path(graphed.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__")
    )
    info = package / "_build_info.py"
    info.write_text(
        # A torch no supported graphed runs with, so it differs from whatever runs the suite.
        re.sub(r"(?m)^torch_version = .*$", 'torch_version = "1.13.1+cu117"', info.read_text())
    )
    result = _doctor_run(tmp_path, pythonpath=str(tmp_path / "site"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "graphed cannot load: graphed was built for torch 1.13.1+cu117" in result.stdout
    assert "pip install --no-build-isolation" in result.stdout
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.skipif(not EXPECT_INSTALLED, reason="only when the suite runs against a wheel")
def test_installed_package_is_the_one_imported():
    assert Path(graphed.__file__).resolve().is_relative_to(Path(sys.prefix).resolve())
    assert not Path(graphed.__file__).resolve().is_relative_to(CHECKOUT / "python")


@pytest.mark.skipif(not EXPECT_INSTALLED, reason="only when the suite runs against a wheel")
def test_native_files_carry_no_build_path():
    native = Path(graphed.library_path()).parent
    files = sorted(native.glob("*.so"))
    assert len(files) == 2, files
    for path in files:
        data = path.read_bytes()
        assert str(CHECKOUT).encode() not in data, f"{path.name} names the checkout"
        if shutil.which("readelf"):
            dynamic = subprocess.run(
                ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
            ).stdout
            runpath = re.search(r"R(?:UN)?PATH.*\[(.*)\]", dynamic)
            assert runpath, dynamic
            for entry in runpath.group(1).split(":"):
                assert entry.startswith("$ORIGIN"), f"{path.name}: RUNPATH entry {entry}"


def test_doctor_says_why_the_cuda_backend_is_missing_and_the_command_that_builds_it(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(_doctor, "nvcc_candidates", lambda torch_dir, major: [])
    why, fix = _doctor.cuda_left_out("13.0", ("xpu",), tmp_path)
    assert "no nvcc of CUDA 13.0 was found when graphed was built, nor now" in why
    assert "nvidia-cuda-nvcc" in fix and "--force-reinstall" in fix, fix
    nvcc = tmp_path / "bin" / "nvcc"
    monkeypatch.setattr(_doctor, "nvcc_candidates", lambda torch_dir, major: [nvcc])
    monkeypatch.setattr(_doctor, "_nvcc_release", lambda found: "13.0")
    why, fix = _doctor.cuda_left_out("13.0", (), tmp_path)
    assert f"but one is here now: {nvcc} (CUDA 13.0)" in why
    assert fix.startswith(f"{sys.executable} -m pip install --no-build-isolation")
    assert _doctor.cuda_left_out("13.0", ("cuda",), tmp_path) is None
    assert _doctor.cuda_left_out(None, (), tmp_path) is None


def test_doctor_prints_what_the_build_said_when_it_left_the_cuda_backend_out(
    monkeypatch, capsys, tmp_path
):
    said = "no nvcc of CUDA 13 (install nvidia-cuda-nvcc 13.0)"
    recorded = type(sys)("graphed._build_info")
    recorded.__dict__.update(
        torch_version="2.14.1", torch_cuda="13.0", cuda_toolkit=None, cuda_architectures=None,
        backends=(), cuda_left_out=said,
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "graphed._build_info", recorded)
    monkeypatch.setattr(_doctor, "nvcc_candidates", lambda torch_dir, major: [])
    left_out = _doctor.report_build(lambda version, cuda: None, tmp_path)
    out = capsys.readouterr().out
    assert left_out is not None and "no nvcc of CUDA 13" in left_out[0]
    assert "NOT BUILT" in out and said in out, out
