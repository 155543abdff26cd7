"""The package as built: it loads the operator library that C++ programs link,
refuses a torch it was not built against, and installs its CMake package."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import AVX512_CPU_KERNELS

import fastreduce_torch
from fastreduce_torch import _build_info
from fastreduce_torch._library import check_torch


def test_built_against_the_running_torch():
    assert _build_info.TORCH_VERSION == str(torch.__version__)


def test_operators_come_from_the_python_free_library():
    library = os.path.join(os.path.dirname(fastreduce_torch.__file__), "libfastreduce_ops.so")
    assert library in torch.ops.loaded_libraries
    with open("/proc/self/maps") as maps:
        assert library in maps.read()
    needed = subprocess.run(["readelf", "-d", library], capture_output=True, text=True).stdout
    if needed:  # readelf is there: LibTorch, and no Python
        assert "libtorch_cpu.so" in needed and "libc10.so" in needed
        assert "libtorch_python" not in needed and "libpython" not in needed


@pytest.mark.skipif(not os.path.exists(AVX512_CPU_KERNELS), reason="no AVX-512 CPU kernels in this build")
@pytest.mark.parametrize("named", [None, "avx2", "avx512"])
def test_avx512_cpu_kernels_load_where_torch_runs_its_own(named):
    # ATEN_CPU_CAPABILITY names torch's capability (only lowers it): ours follow.
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if named:
        env["ATEN_CPU_CAPABILITY"] = named
    code = ("import torch, fastreduce_torch; maps = open('/proc/self/maps').read(); "
            f"print(torch.backends.cpu.get_cpu_capability(), {AVX512_CPU_KERNELS!r} in maps)")
    capability, loaded = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                        check=True).stdout.split()
    assert loaded == str(capability == "AVX512")
    if named == "avx2":
        assert capability != "AVX512"


def test_cmake_package_is_installed():
    folder = os.path.join(fastreduce_torch.cmake_prefix_path, "fastreduce")
    assert os.path.isfile(os.path.join(folder, "fastreduceConfig.cmake"))
    header = os.path.join(os.path.dirname(fastreduce_torch.__file__), "include", "fastreduce", "fastreduce.h")
    assert os.path.isfile(header)


def test_version_check_accepts_the_same_build():
    check_torch("2.14.1+cu130", "2.14.1+cu130")


@pytest.mark.parametrize("running", ["2.13.0+cpu", "2.14.1+cpu", "2.14.0+cu130"])
def test_version_check_refuses_another_build(running):
    with pytest.raises(ImportError, match=r"built against torch 2\.14\.1\+cu130, but torch .* is installed") as err:
        check_torch("2.14.1+cu130", running)
    assert running in str(err.value) and "rebuild" in str(err.value)


def test_import_under_another_torch_fails_cleanly_before_loading():
    script = (
        "import torch; torch.__version__ = '0.0.1'\n"
        "try:\n"
        "    import fastreduce_torch\n"
        "except ImportError as e:\n"
        "    print('refused:', e)\n"
        "print('loaded:', any('fastreduce_ops' in lib for lib in torch.ops.loaded_libraries))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "refused: fastreduce_torch was built against torch" in result.stdout
    assert "0.0.1" in result.stdout
    assert "loaded: False" in result.stdout


def test_no_script_folder_shadows_the_standard_library():
    # A script puts its own folder first on sys.path, so bench/statistics.py
    # would be what `import statistics` finds in every bench beside it.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for folder in ("bench", "examples", "scripts"):
        names = {os.path.splitext(f)[0] for f in os.listdir(os.path.join(root, folder)) if f.endswith(".py")}
        assert not names & sys.stdlib_module_names, folder
