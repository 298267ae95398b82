# SPDX-License-Identifier: Apache-2.0
"""tangram.cuda: the CUDA launchers of tangram::kernels on device tensors (DLPack or
``__cuda_array_interface__``: PyTorch, CuPy, Numba) with a stream argument, over a device mirror
of the manager's view (docs/python.md). Present when the package was built with the kernels
(``pip install . -Ccmake.define.TANGRAM_ENABLE_CUDA=ON``, with nvcc)."""
from __future__ import annotations

from . import _tangram

if not _tangram.has_cuda_kernels:
    raise ImportError("tangram.cuda: this package was built without the CUDA kernels "
                      "(`pip install . -Ccmake.define.TANGRAM_ENABLE_CUDA=ON` builds them; needs nvcc)")

from ._tangram.cuda import *  # noqa: E402,F401,F403
