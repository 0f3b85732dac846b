"""`python -m graphed`: the doctor. It exists so that a user (or a bug report) can say in one
command what is installed and whether it works: graphed, torch, CUDA and driver versions, the torch
this build was made for against the running one, the backends built in and the one chosen at load
with its reasons, the devices, and a few-second self-test (capture, replay and compare with eager
on a tiny module; without a GPU, the eager fallback). Where torch has CUDA but the build left the
CUDA backend out (no nvcc of torch's CUDA version was found), it says so, why, and the one
command that builds it. It exits non-zero when the self-test fails,
and when graphed cannot load (a build made for another torch, a checkout never built): then it
prints the import's message and what to do, without a traceback. A warning torch gives at its
import about its own environment (a NumPy it cannot use) is a line of the report, not the
report's first words. `python -m graphed bench` runs the short benchmark of a checkout (bench/ is
not installed)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote, urlparse

_OK, _FAIL = "pass", "FAIL"
_DESCRIPTION = (
    "The graphed doctor: prints what is installed (graphed, torch, the NVIDIA driver, the torch "
    "this build was made for, the backends built in and the one chosen at load, the devices) "
    "and runs a few-second self-test that compares graphed with eager on a tiny module."
)
_EPILOG = (
    "It exits with status 0 when the self-test passes, and 1 when the self-test fails or "
    "graphed cannot load."
)
# A driver's raw result code in a backend's reason, e.g. Level Zero's "(result 0x78000001)":
# the reason says it in words before it; --verbose keeps the code.
_RAW_RESULT = re.compile(r" \(result 0x[0-9a-fA-F]+\)")
# torch's words for a NumPy it cannot use, warned once when torch is imported (TORCH_WARN in
# torch/csrc/utils/tensor_numpy.cpp: "Failed to initialize NumPy: No module named 'numpy'", or
# what a NumPy built for another ABI raises), and the C++ location TORCH_WARN adds to it.
_NUMPY_WARNING = re.compile(r"NumPy")
_TRIGGERED_AT = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")
# What torch said at its import about NumPy under the doctor, for the report's numpy line.
_torch_import_findings: list[str] = []


def _line(label: str, value: object) -> None:
    print(f"  {label:<22} {value}")


def in_words(reason: str, verbose: bool = False) -> str:
    """A backend's reason as the doctor prints it: without the drivers' raw result codes, unless
    `verbose`."""
    return reason if verbose else _RAW_RESULT.sub("", reason)


@contextlib.contextmanager
def _log_without(text: str) -> Iterator[None]:
    """Drops the records of logger "graphed" that repeat `text` (the reason the report printed
    already) while the block runs."""
    logger = logging.getLogger("graphed")

    def new_to_the_reader(record: logging.LogRecord) -> bool:
        return not text or text not in record.getMessage()

    logger.addFilter(new_to_the_reader)
    try:
        yield
    finally:
        logger.removeFilter(new_to_the_reader)


def import_torch_quietly() -> None:
    """Imports torch for the doctor, before anything of graphed does (the package's first module
    calls it under `python -m graphed` only): torch's UserWarning about NumPy is kept for the
    report's numpy line instead of opening the report; any other warning is shown as it would
    be. A program that imports graphed sees torch's warnings as torch gives them."""
    if "torch" in sys.modules or not running_as_doctor():
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torch  # noqa: F401
        except ImportError:
            pass  # the import after this one raises it again, and the report says so
    for shown in caught:
        text = str(shown.message)
        if issubclass(shown.category, UserWarning) and _NUMPY_WARNING.search(text):
            _torch_import_findings.append(_TRIGGERED_AT.sub("", text))
        else:
            warnings.warn_explicit(shown.message, shown.category, shown.filename, shown.lineno)


def numpy_state() -> str:
    """The report's numpy line: its version, or what torch said of it at its import (graphed
    itself does not need NumPy; torch's tensor.numpy() and from_numpy do)."""
    if _torch_import_findings:
        return (
            f"not usable by torch ({'; '.join(_torch_import_findings)}); graphed does not need it"
        )
    numpy = sys.modules.get("numpy")
    version = getattr(numpy, "__version__", None)
    return str(version) if version else "not imported by torch; graphed does not need it"


def driver_version() -> str:
    """The NVIDIA driver's version, from nvidia-smi, else pynvml, else why not (the doctor and
    the benchmark's report both print it)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.strip()
            if out:
                return out.splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # pynvml missing or failing: say so
        return "unknown (no nvidia-smi or pynvml answer)"


_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def _nvcc_release(nvcc: Path) -> str | None:
    """The CUDA release ("13.0") of the nvcc at `nvcc`, or None when it is not one that runs."""
    if not nvcc.is_file():
        return None
    try:
        out = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = _NVCC_RELEASE.search(out)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def nvcc_candidates(torch_dir: Path, cuda_major: str) -> list[Path]:
    """Where the build looks for an nvcc of CUDA `cuda_major`, in its order
    (cmake/GraphedTorchCudaHints.cmake): CUDA_HOME, CUDA_PATH, the nvcc on the PATH,
    /usr/local/cuda, then the nvcc wheels beside torch (`torch_dir` is torch's package folder)."""
    found = [
        Path(os.environ[name]) / "bin" / "nvcc"
        for name in ("CUDA_HOME", "CUDA_PATH")
        if os.environ.get(name)
    ]
    on_path = shutil.which("nvcc")
    if on_path:
        found.append(Path(on_path))
    found.append(Path("/usr/local/cuda/bin/nvcc"))
    found.append(torch_dir.parent / "nvidia" / f"cu{cuda_major}" / "bin" / "nvcc")
    return found


def install_source() -> tuple[str, bool]:
    """What `pip install` took graphed from, as pip recorded it (PEP 610 direct_url.json): the
    checkout's folder (or the checkout whose build/dist held the wheel, as scripts/setup.sh
    makes it), quoted for a shell, and whether it was an editable install; a placeholder where
    pip recorded neither (a wheel built elsewhere)."""
    try:
        recorded = metadata.distribution("graphed").read_text("direct_url.json")
        url = json.loads(recorded or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        url = {}
    where = urlparse(str(url.get("url", "")))
    if where.scheme == "file":
        path = Path(unquote(where.path))
        for folder in [path, *path.parents[:3]]:
            if (folder / "pyproject.toml").is_file():
                return shlex.quote(str(folder)), bool(url.get("dir_info", {}).get("editable"))
    return "<your graphed checkout>", False


def cuda_left_out(
    build_torch_cuda: str | None, backends: tuple[str, ...], torch_dir: Path
) -> tuple[str, str] | None:
    """Why this build has no CUDA backend although torch has CUDA `build_torch_cuda`, and the one
    command that builds it (no GPU needed); None where the backend is built or torch has no CUDA.
    The build leaves the backend out when it finds no nvcc of torch's CUDA major.minor, and pip
    shows what the build said only with -v: this says it after the fact."""
    if not build_torch_cuda or "cuda" in backends:
        return None
    from . import _library  # the nvcc wheels of a CUDA release; it imports torch, already loaded

    major = build_torch_cuda.split(".")[0]
    wanted = _library.cuda_release(build_torch_cuda)
    source, editable = install_source()
    python = sys.executable or "python"
    pip = f"{shlex.quote(python)} -m pip"
    rebuild = (
        f"{pip} install --no-build-isolation --force-reinstall --no-deps "
        f"{'-e ' if editable else ''}{source}"
    )
    others = []
    for nvcc in nvcc_candidates(torch_dir, major):
        release = _nvcc_release(nvcc)
        if release == wanted:
            why = (
                f"torch has CUDA {build_torch_cuda}; this build found no nvcc of CUDA {wanted} "
                f"(or was made with GRAPHED_WITH_CUDA=OFF), but one is here now: {nvcc} "
                f"(CUDA {release}). Build graphed again"
            )
            return why, rebuild
        if release:
            others.append(f"{nvcc} (CUDA {release})")
    why = (
        f"torch has CUDA {build_torch_cuda}, but no nvcc of CUDA {wanted} was found when graphed "
        "was built, nor now (CUDA_HOME, CUDA_PATH, the PATH, /usr/local/cuda, the nvcc wheels "
        "beside torch); no GPU is needed to build it"
    )
    if others:
        why += f"; only {', '.join(others)}, and torch's build accepts only its own CUDA release"
    install = _library.nvcc_wheels_command(build_torch_cuda, python)
    if install:
        return why, f"{install} && {rebuild}"
    # PyPI's nvcc wheels of CUDA 12 and older unpack in another layout that the build does not use.
    return why, f"CUDA_HOME=<a CUDA {wanted} toolkit> {rebuild}"


class _Tiny:
    """Builds the self-test's module lazily, so that importing this file needs no torch."""

    @staticmethod
    def make(torch):
        class TinyForward(torch.nn.Module):
            """out = {"y": gelu(x @ w + b) * scale, "sum": ...}: a few kernels, a dict output."""

            def __init__(self) -> None:
                super().__init__()
                generator = torch.Generator().manual_seed(0)
                self.weight = torch.nn.Parameter(torch.randn(16, 16, generator=generator))
                self.bias = torch.nn.Parameter(torch.randn(16, generator=generator))

            def forward(self, *, x, scale):
                y = torch.nn.functional.gelu(x @ self.weight + self.bias) * scale
                return {"y": y, "sum": y.sum(dim=-1)}

        return TinyForward()


def self_test(device_name: str, shown_reason: str = "") -> tuple[bool, str]:
    """Runs a tiny module eager and through GraphedForward on `device_name` and compares them.
    On a CUDA device it expects a capture and replays; elsewhere, eager calls. A disabled reason
    that contains `shown_reason` (printed by the report already) is not repeated."""
    import torch

    import graphed

    device = torch.device(device_name)
    generator = torch.Generator().manual_seed(1)
    module = _Tiny.make(torch).to(device).eval()
    gf = graphed.GraphedForward(module, device=device, name="doctor", warmup_iters=2)
    worst = 0.0
    with torch.no_grad():
        for _ in range(4):
            kwargs = {
                "x": torch.randn(4, 16, generator=generator).to(device),
                "scale": torch.rand(1, generator=generator).to(device) + 0.5,
            }
            want = module(**kwargs)
            got = gf(**cast(dict[str, Any], kwargs))
            for key in ("y", "sum"):
                if not torch.allclose(got[key], want[key], rtol=1e-4, atol=1e-5):
                    diff = (got[key] - want[key]).abs().max().item()
                    return False, f"output {key!r} differs from eager by {diff:g}"
                worst = max(worst, (got[key] - want[key]).abs().max().item())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    stats = gf.stats()
    summary = (
        f"captures {stats['captures']}, replays {stats['replays']}, "
        f"eager calls {stats['eager_calls']}, max |graphed - eager| {worst:.2g}"
    )
    if device.type == "cuda" and stats["enabled"]:
        # the capturing call is a replay, or answered from its last warm-up (docs/api.md)
        if stats["captures"] < 1 or stats["captures"] + stats["replays"] < 4:
            return False, f"expected 4 calls served by one graph; {summary}"
        return True, f"captured and replayed on {device}; {summary}"
    if stats["eager_calls"] < 4:
        return False, f"expected 4 eager calls; {summary}"
    reason = stats.get("disabled_reason") or "graphs unavailable"
    if shown_reason and shown_reason in reason:
        reason = f"backend {stats['backend']}, as above"
    return True, f"graphs unavailable on {device} ({reason}); eager fallback agrees; {summary}"


def report_unusable_install(error: ImportError) -> int:
    """The report when graphed cannot load (`error` is the ImportError of its import check, which
    names the cause and the command that fixes it): printed without a traceback; returns 1."""
    print("graphed doctor")
    _line("python", f"{platform.python_version()} ({sys.executable})")
    try:
        import torch

        _line("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    except ImportError as torch_error:
        _line("torch", f"not importable: {torch_error}")
    print(f"\ngraphed cannot load: {error}")
    print("\nDo what the message says, then run `python -m graphed` again.")
    return 1


def running_as_doctor() -> bool:
    """Whether this process is `python -m graphed` still importing the package (runpy keeps
    sys.argv[0] at "-m" until it has found the module to run)."""
    if sys.argv[:1] != ["-m"]:
        return False
    command = list(getattr(sys, "orig_argv", []))
    pairs = zip(command, command[1:], strict=False)
    return "-mgraphed" in command or any(a == "-m" and b == "graphed" for a, b in pairs)


def exit_if_doctor(error: ImportError) -> None:
    """For the package's import check, with its ImportError: under `python -m graphed` the doctor
    reports it and the process exits with status 1; anywhere else this returns and the import
    raises as before."""
    if running_as_doctor():
        raise SystemExit(report_unusable_install(error))


def report_build(
    torch_mismatch: Callable[[str, str | None], str | None], torch_dir: Path
) -> tuple[str, str] | None:
    """Prints what the build was made for and with (graphed._build_info, which the build
    generates), and whether the running torch matches (`torch_mismatch`, graphed._library's);
    returns why the CUDA backend was left out and the command that builds it, or None."""
    try:
        build_info = importlib.import_module("graphed._build_info")
    except ImportError:
        _line("build info", "missing (not a pip or cmake --install build)")
        return None
    _line("built for torch", f"{build_info.torch_version} (CUDA {build_info.torch_cuda or 'none'})")
    _line("CUDA toolkit (build)", build_info.cuda_toolkit or "none")
    _line("CUDA archs (build)", build_info.cuda_architectures or "none")
    _line("backends built in", ", ".join(build_info.backends) or "none (eager only)")
    left_out = cuda_left_out(build_info.torch_cuda, tuple(build_info.backends), torch_dir)
    if left_out is not None:
        _line("CUDA backend", "NOT BUILT (graphed runs eager; why and the fix at the end)")
        said = getattr(build_info, "cuda_left_out", None)
        if said:
            _line("  the build said", said)
    mismatch = torch_mismatch(build_info.torch_version, build_info.torch_cuda)
    _line("torch match", f"{_FAIL}: {mismatch}" if mismatch else "yes")
    return left_out


def doctor(verbose: bool = False) -> int:
    """Prints the report; returns the exit status (1 when the self-test fails or graphed cannot
    load). `verbose` keeps the drivers' raw result codes in the backend's reason."""
    print("graphed doctor")
    _line("python", f"{platform.python_version()} ({sys.executable})")
    try:
        import torch
    except ImportError as error:
        _line("torch", f"not importable: {error}")
        return 1
    _line("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    _line("numpy", numpy_state())
    _line("NVIDIA driver", driver_version())

    try:
        from . import _library
    except ImportError as error:
        return report_unusable_install(error)

    left_out = report_build(_library.torch_mismatch, Path(torch.__file__).parent)

    try:
        import graphed
    except ImportError as error:
        print(f"\ngraphed cannot load: {error}")
        print("\nDo what the message says, then run `python -m graphed` again.")
        return 1
    _line("graphed", f"{graphed.__version__} ({Path(graphed.__file__).parent})")
    _line("native library", graphed.library_path())
    name, reason = torch.ops.graphed.backend()
    _line("backend at load", name)
    _line("  why", in_words(reason, verbose))
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            _line(f"cuda:{index}", f"{props.name}, sm_{props.major}{props.minor}")
    else:
        _line("CUDA devices", "none visible to torch")

    device = "cuda" if name == "cuda" and torch.cuda.is_available() else "cpu"
    print(f"\nself-test on {device}:")
    try:
        with _log_without(reason):
            passed, detail = self_test(device, shown_reason=reason)
    except Exception as error:  # noqa: BLE001 - the doctor reports every failure
        passed, detail = False, f"{type(error).__name__}: {error}"
    print(f"  {_OK if passed else _FAIL}: {detail}")
    if left_out is not None:
        # Last, where it is read: the build said it only under pip -v.
        why, fix = left_out
        print(f"\nThe CUDA backend was not built: {why}. To build it, run:\n  {fix}")
    return 0 if passed else 1


def _bench_dir() -> Path | None:
    """bench/ of a checkout: $GRAPHED_BENCH_DIR, ./bench, or beside the imported package's tree."""
    candidates = []
    if os.environ.get("GRAPHED_BENCH_DIR"):
        candidates.append(Path(os.environ["GRAPHED_BENCH_DIR"]))
    candidates.append(Path.cwd() / "bench")
    candidates.append(Path(__file__).resolve().parents[2] / "bench")
    for folder in candidates:
        if (folder / "run.py").is_file():
            return folder
    return None


def bench(out: Path) -> int:
    """Runs bench/run.py --quick --no-compile with its results in `out`."""
    folder = _bench_dir()
    if folder is None:
        print(
            "graphed bench: bench/ is not installed with the package; run this from a graphed "
            "checkout (or set GRAPHED_BENCH_DIR to its bench folder)"
        )
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    command = [sys.executable, str(folder / "run.py"), "--quick", "--no-compile", "--out", str(out)]
    print("graphed bench:", " ".join(command), flush=True)
    return subprocess.call(command, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m graphed", description=_DESCRIPTION, epilog=_EPILOG
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="keep the drivers' raw result codes in the backend's reason",
    )
    sub = parser.add_subparsers(dest="command")
    bench_parser = sub.add_parser("bench", help="the short benchmark of a checkout's bench/")
    bench_parser.add_argument("--out", type=Path, default=Path("graphed-bench"))
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench(args.out)
    return doctor(verbose=args.verbose)
