"""The NVIDIA libraries the core links, loaded from NVIDIA's wheels (PyTorch's and JAX's CUDA builds bring them)
where the environment has them, before the core.

A process loads a shared library once per soname: whichever of ringattn and PyTorch loads libnccl.so.2 first decides
the copy both use. Loaded by the core from the CUDA toolkit, an NCCL older than PyTorch's own left PyTorch without
symbols it needs (`import ringattn` before `import torch` failed: "undefined symbol: ncclCommResume"); the wheels'
copies are the ones PyTorch and JAX load themselves. Without the wheels nothing is loaded here and the core finds
the toolkit's libraries as it was linked to."""

import ctypes
import glob
import os
import sys

# In dependency order: cuBLAS loads cuBLASLt.
_SONAMES = ("libcublasLt.so.13", "libcublas.so.13", "libnvrtc.so.13", "libnccl.so.2", "libcudnn.so.9")


def _wheel_libs():
    """Every nvidia/<package>/lib folder along sys.path, in its order."""
    return [lib for entry in sys.path
            for lib in sorted(glob.glob(os.path.join(entry or os.curdir, "nvidia", "*", "lib")))]


def load_from_wheels():
    """Loads each library the wheels hold (globally, as PyTorch does), the first copy along sys.path; returns the
    paths loaded."""
    loaded = []
    if not sys.platform.startswith("linux"):
        return loaded
    libs = _wheel_libs()
    for soname in _SONAMES:
        path = next((os.path.join(lib, soname) for lib in libs if os.path.exists(os.path.join(lib, soname))), None)
        if path is None:
            continue
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            loaded.append(path)
        except OSError:  # not loadable here (another CUDA's wheel): the core's own search decides
            pass
    return loaded
