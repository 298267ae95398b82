# SPDX-License-Identifier: Apache-2.0
"""tangram.cuda: the CUDA launchers on device tensors. Present when the package was built with the
kernels (nvcc found at `pip install .`). Without a device, what can be checked is checked: the
tensor protocol parsing, the errors before any launch, and that nothing crashes; the launches
themselves run where a GPU and PyTorch or CuPy exist (and in scripts/gpu_check.sh from C++)."""
import importlib

import numpy as np
import pytest

import tangram

needs_kernels = pytest.mark.skipif(not tangram.has_cuda_kernels,
                                   reason="package built without the CUDA kernels")


class FakeDeviceArray:
    """An object exporting only __cuda_array_interface__ (as Numba's device arrays do)."""

    def __init__(self, **interface):
        self.__cuda_array_interface__ = {"version": 3, **interface}


def test_host_only_builds_say_so(static_plan):
    if tangram.has_cuda_kernels:
        cuda = importlib.import_module("tangram.cuda")
        assert cuda.DeviceMirror is tangram.cuda.DeviceMirror
        assert hasattr(cuda, "decode_attention")
        return
    with pytest.raises(ImportError, match="built without the CUDA kernels"):
        importlib.import_module("tangram.cuda")
    with pytest.raises(ValueError, match="memory: 'cuda' needs the package built with the CUDA"):
        tangram.KVCacheManager(static_plan, num_pages=16, max_sequences=1, memory="cuda")


def test_memory_is_checked(static_plan):
    with pytest.raises(ValueError, match="memory: must be 'host' or 'cuda', got 'gpu'"):
        tangram.KVCacheManager(static_plan, num_pages=16, max_sequences=1, memory="gpu")


@needs_kernels
def test_tensor_info_reads_the_cuda_array_interface():
    t = FakeDeviceArray(shape=(4, 8, 128), typestr="<f2", data=(0x7F0000000000, False))
    info = tangram.cuda.tensor_info(t)
    assert info == {"data": 0x7F0000000000, "dtype": "float16", "shape": (4, 8, 128),
                    "device": -1, "readonly": False}
    ro = FakeDeviceArray(shape=(3,), typestr="<i4", data=(0x7F0000001000, True))
    assert tangram.cuda.tensor_info(ro)["readonly"] is True
    # C-contiguous strides are accepted, others are refused with the dimension.
    ok = FakeDeviceArray(shape=(2, 3), typestr="<u4", data=(0x7F0000002000, False), strides=(12, 4))
    assert tangram.cuda.tensor_info(ok)["shape"] == (2, 3)
    bad = FakeDeviceArray(shape=(2, 3), typestr="<u4", data=(0x7F0000002000, False), strides=(4, 8))
    with pytest.raises(ValueError, match="must be C-contiguous \\(dimension 0 has a stride of 4 bytes\\)"):
        tangram.cuda.tensor_info(bad)
    masked = FakeDeviceArray(shape=(2,), typestr="<u4", data=(0x7F0000002000, False), mask=object())
    with pytest.raises(ValueError, match="masked arrays are not supported"):
        tangram.cuda.tensor_info(masked)
    odd = FakeDeviceArray(shape=(2,), typestr=">f4", data=(0x7F0000002000, False))
    with pytest.raises(ValueError, match="typestr '>f4' is not a little-endian scalar type"):
        tangram.cuda.tensor_info(odd)


@needs_kernels
def test_tensor_info_refuses_host_arrays():
    with pytest.raises(ValueError, match=r"expected a CUDA tensor, got one on DLPack device type 1 \(cpu\)"):
        tangram.cuda.tensor_info(np.zeros(4, dtype=np.float32))
    frozen = np.zeros(4, dtype=np.float32)
    frozen.flags.writeable = False  # exported read-only (DLPack 1.0): read, then refused as cpu
    with pytest.raises(ValueError, match=r"got one on DLPack device type 1 \(cpu\)"):
        tangram.cuda.tensor_info(frozen)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        tangram.cuda.tensor_info([1, 2, 3])


@needs_kernels
def test_device_count_never_raises():
    assert tangram.cuda.device_count() >= 0


@needs_kernels
def test_a_mirror_needs_a_device_arena(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=16, max_sequences=1)
    with pytest.raises(ValueError, match="DeviceMirror: the manager's page arena is host memory"):
        tangram.cuda.DeviceMirror(kv)
    with pytest.raises(ValueError, match="execute_page_copies: the manager's arena is host memory"):
        tangram.cuda.execute_page_copies(kv)


@needs_kernels
@pytest.mark.skipif(tangram.has_cuda_kernels and tangram.cuda.device_count() > 0,
                    reason="a device exists: the arena is allocated")
def test_a_device_arena_without_a_device_is_a_clear_error(static_plan):
    with pytest.raises((RuntimeError, MemoryError), match="cuda"):
        tangram.KVCacheManager(static_plan, num_pages=16, max_sequences=1, memory="cuda")


@needs_kernels
@pytest.mark.parametrize("interface, message", [
    ({"shape": 5, "typestr": "<f4", "data": (4096, False)}, "shape must be a tuple"),
    ({"shape": "ab", "typestr": "<f4", "data": (4096, False)}, "shape must be a tuple"),
    ({"shape": [2, 3], "typestr": "<f4", "data": (4096, False)}, "shape must be a tuple"),
    ({"shape": None, "typestr": "<f4", "data": (4096, False)}, "shape must be a tuple"),
    ({"shape": (2.5,), "typestr": "<f4", "data": (4096, False)}, "shape must be an integer"),
    ({"shape": (2 ** 63,), "typestr": "<f4", "data": (4096, False)}, "shape must be an integer"),
    ({"shape": (2 ** 40, 2 ** 40), "typestr": "<f4", "data": (4096, False)}, "overflows"),
    ({"shape": (2,), "typestr": 4, "data": (4096, False)}, "typestr must be a string"),
    ({"shape": (2,), "typestr": "<f4", "data": [4096, False]}, "data must be a tuple"),
    ({"shape": (2,), "typestr": "<f4", "data": (-1, False)}, "data pointer must be an integer"),
    ({"shape": (2,), "typestr": "<f4", "data": ("x", False)}, "data pointer must be an integer"),
    ({"shape": (2,), "typestr": "<f4", "data": (4096, 0)}, "data must be \\(pointer, read_only\\)"),
    ({"shape": (2,), "typestr": "<f4", "data": (0, False)}, "data pointer is null"),
    ({"shape": (2, 3), "typestr": "<f4", "data": (4096, False), "strides": 4}, "strides must be a tuple"),
    ({"shape": (2, 3), "typestr": "<f4", "data": (4096, False), "strides": (12,)}, "1 strides for 2 dimensions"),
    ({"shape": (2, 3), "typestr": "<f4", "data": (4096, False), "strides": [12, 4]}, "strides must be a tuple"),
])
def test_a_lying_cuda_array_interface_is_an_error_not_a_crash(interface, message):
    with pytest.raises(ValueError, match=message):
        tangram.cuda.tensor_info(FakeDeviceArray(**interface))


@needs_kernels
def test_a_mirror_needs_a_manager():
    for wrong in (3, "kv", object()):
        with pytest.raises(TypeError, match="kv must be a KVCacheManager"):
            tangram.cuda.DeviceMirror(wrong)
    with pytest.raises(TypeError):
        tangram.cuda.DeviceMirror(None)
