"""Builds fastreduce_torch._C against the torch already installed.

CUDA sources are compiled whenever nvcc is found (no GPU needed);
FASTREDUCE_CUDA=0 forces a CPU-only build. TORCH_CUDA_ARCH_LIST picks the
architectures (default 8.0;9.0).
"""

import glob
import os
import platform
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

import torch  # noqa: E402
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


def cpu_vector_flags():
    """at::vec compiles to scalar loops unless a CPU capability is named: on
    x86-64 the CPU kernels use AVX2, FMA and F16C (every x86-64 server since
    2013). FASTREDUCE_CPU_AVX2=0 builds the portable scalar form instead."""
    if platform.machine().lower() not in ("x86_64", "amd64") or os.environ.get("FASTREDUCE_CPU_AVX2", "1") == "0":
        return []
    return ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]


def openmp_flags():
    """at::parallel_for is inline: without OpenMP in our own build it runs on
    one thread. torch's libgomp.so.1 is already loaded and serves ours."""
    return ["-fopenmp"] if platform.system() == "Linux" else []


def extension():
    sources = sorted(glob.glob("csrc/torch/*.cpp"))
    cxx = ["-O3"] + cpu_vector_flags() + openmp_flags()  # torch picks the C++ standard its headers need
    link = openmp_flags()
    if not want_cuda():
        sources = [s for s in sources if not s.endswith("_cuda.cpp")]
        return cpp_extension.CppExtension("fastreduce_torch._C", sources, extra_compile_args={"cxx": cxx},
                                          extra_link_args=link)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    sources += sorted(glob.glob("csrc/launch/*.cu"))
    # torch's defaults hide the half-type conversions the kernels use.
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"] + [
        f"-U__CUDA_NO_{name}__"
        for name in ("HALF_OPERATORS", "HALF_CONVERSIONS", "HALF2_OPERATORS", "BFLOAT16_CONVERSIONS")
    ]
    return cpp_extension.CUDAExtension(
        "fastreduce_torch._C",
        sources,
        define_macros=[("FASTREDUCE_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        extra_link_args=link,
    )


setup(
    name="fastreduce_torch",
    version="0.1.0",
    description="Reduction, layer-norm and softmax operators for PyTorch in C++/CUDA",
    packages=find_packages(include=["fastreduce_torch", "fastreduce_torch.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.10",
    install_requires=["torch>=2.5"],
)
