"""Builds fastreduce_torch against the torch already installed: the operator
library libfastreduce_ops through CMake, then the Python module _C.

CUDA sources are compiled whenever nvcc is found (no GPU needed);
FASTREDUCE_CUDA=0 forces a CPU-only build. TORCH_CUDA_ARCH_LIST picks the
architectures (default 8.0;9.0); FASTREDUCE_CPU_AVX2=0 builds the CPU kernels
without AVX2 (and without their AVX-512 copies, libfastreduce_cpu_avx512); MAX_JOBS
bounds the parallel compiles.
"""

import os
import re
import subprocess

import shutil

from setuptools import find_packages, setup


def locate_cuda_home():
    """torch takes CUDA_HOME from the nvcc on PATH; a wrapper script in
    /usr/local/bin would make that /usr/local, which has no CUDA headers."""
    if "CUDA_HOME" in os.environ or "CUDA_PATH" in os.environ:
        return
    nvcc = shutil.which("nvcc")
    if nvcc and not os.path.exists(os.path.join(os.path.dirname(nvcc), "..", "include", "cuda_runtime.h")):
        if os.path.exists("/usr/local/cuda/include/cuda_runtime.h"):
            os.environ["CUDA_HOME"] = "/usr/local/cuda"


locate_cuda_home()

try:
    import torch  # noqa: E402
except ImportError:
    # pip's isolated build environment has no torch (pyproject.toml does not ask
    # for one: a build against a freshly downloaded torch would not import
    # beside the user's own).
    raise SystemExit(
        "fastreduce builds against the torch already installed, which pip's isolated build cannot see: "
        "install with `pip install --no-build-isolation .` (or `make install`), after installing torch."
    ) from None
from torch.utils import cpp_extension  # noqa: E402


def nvcc_major(cuda_home):
    out = subprocess.check_output([os.path.join(cuda_home, "bin", "nvcc"), "--version"], text=True)
    return int(re.search(r"release (\d+)\.", out).group(1))


def want_cuda():
    if os.environ.get("FASTREDUCE_CUDA", "1") == "0":
        return False
    if cpp_extension.CUDA_HOME is None:
        print("fastreduce: nvcc not found, building the CPU operators only")
        return False
    if torch.version.cuda is None:
        print("fastreduce: this torch has no CUDA, building the CPU operators only")
        return False
    torch_major = int(torch.version.cuda.split(".")[0])
    found = nvcc_major(cpp_extension.CUDA_HOME)
    if found != torch_major:
        raise SystemExit(
            f"fastreduce: nvcc at {cpp_extension.CUDA_HOME} is CUDA {found}, but torch "
            f"{torch.__version__} was built with CUDA {torch.version.cuda}. Install a CUDA {torch_major} "
            "toolkit (or point CUDA_HOME at one), or build for the CPU only with FASTREDUCE_CUDA=0."
        )
    return True


def run(*command):
    print("fastreduce:", " ".join(command), flush=True)
    subprocess.check_call(command)


class BuildWithCMake(cpp_extension.BuildExtension):
    """Builds libfastreduce_ops with CMake (CMakeLists.txt lists the sources
    and flags), installs it with its C++ header and CMake package into the
    package folder, records the torch it was built against, then builds the
    Python module _C, which links it."""

    def run(self):
        package_dir = os.path.dirname(self.get_ext_fullpath("fastreduce_torch._C"))
        cuda = want_cuda()
        build_dir = os.path.join("build", f"cmake-torch{torch.__version__}" + ("" if cuda else "-cpu"))
        configure = ["cmake", "-S", ".", "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                     f"-DFASTREDUCE_CUDA={'ON' if cuda else 'OFF'}", "-DFASTREDUCE_INSTALL_LIBDIR=.",
                     f"-DFASTREDUCE_CPU_AVX2={os.environ.get('FASTREDUCE_CPU_AVX2', '1')}"]
        if torch.version.cuda and cpp_extension.CUDA_HOME:  # a CUDA torch's CMake package looks for CUDA
            configure += [f"-DCUDA_TOOLKIT_ROOT_DIR={cpp_extension.CUDA_HOME}",
                          f"-DCMAKE_CUDA_COMPILER={os.path.join(cpp_extension.CUDA_HOME, 'bin', 'nvcc')}"]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        run(*configure)
        run("cmake", "--build", build_dir, "--parallel", os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)))
        run("cmake", "--install", build_dir, "--prefix", package_dir)
        with open(os.path.join(package_dir, "_build_info.py"), "w") as info:
            info.write(f'"""Written by setup.py: the torch this build was compiled against."""\n\n'
                       f'TORCH_VERSION = "{torch.__version__}"\n')
        for ext in self.extensions:
            ext.library_dirs.append(package_dir)
        super().run()


# The Python module only: the operators are in libfastreduce_ops (CMakeLists.txt).
python_module = cpp_extension.CppExtension(
    "fastreduce_torch._C",
    ["csrc/python/module.cpp"],
    include_dirs=[os.path.abspath("include")],
    libraries=["fastreduce_ops"],
    extra_link_args=["-Wl,-rpath,$ORIGIN"],
)


setup(
    name="fastreduce_torch",
    version="0.1.0",
    description="Reduction, layer-norm and softmax operators for PyTorch in C++/CUDA",
    packages=find_packages(include=["fastreduce_torch", "fastreduce_torch.*"]),
    ext_modules=[python_module],
    cmdclass={"build_ext": BuildWithCMake},
    python_requires=">=3.10",
    install_requires=["torch>=2.5"],
)
