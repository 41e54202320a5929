#!/usr/bin/env python3
"""tests/dlpack_numpy.py LIBEMBER: exchanges tensors between Ember and NumPy through DLPack, with
Ember loaded by ctypes (no binding needed): Ember -> numpy.from_dlpack and a NumPy array's
__dlpack__ -> em_from_dlpack, both without a copy (a write on one side is seen on the other),
both deleters run, nothing leaks. NumPy 2.1+ asks for the versioned struct (max_version=(1, 0),
capsule "dltensor_versioned"); older NumPy (Debian 12's 1.24) for the pre-1.0 one ("dltensor"),
and the producer below answers each as the DLPack Python spec says. Needs numpy (Debian's
python3-numpy, which scripts/setup.sh installs): without it this test says so and is skipped
(exit 77)."""
import ctypes as C
import sys

try:
    import numpy as np
except ImportError:
    print("SKIPPED LOUDLY: dlpack_numpy needs numpy (apt-get install python3-numpy, see scripts/setup.sh); "
          f"{sys.executable} has none, so the NumPy exchange was NOT tested", file=sys.stderr)
    sys.exit(77)

lib = C.CDLL(sys.argv[1])
EM_F32, EM_F64, EM_I64 = 0, 1, 3


class Site(C.Structure):
    _fields_ = [("file", C.c_char_p), ("line", C.c_int), ("func", C.c_char_p)]


HERE = Site(b"dlpack_numpy.py", 1, b"main")


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device_type", C.c_int), ("device_id", C.c_int32), ("ndim", C.c_int32),
                ("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class Versioned(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("manager_ctx", C.c_void_p),
                ("deleter", C.c_void_p), ("flags", C.c_uint64), ("dl_tensor", DLTensor)]


for name, res, args in [
    ("em_scope_begin_at", C.c_bool, [Site]), ("em_scope_end_at", None, [Site]), ("em_thread_cleanup", None, []),
    ("em_from_data_at", C.c_void_p, [C.c_void_p, C.c_int, C.c_int, C.POINTER(C.c_int64), Site]),
    ("em_transpose_at", C.c_void_p, [C.c_void_p, C.c_int, C.c_int, Site]),
    ("em_to_buffer_at", C.c_bool, [C.c_void_p, C.c_int, C.c_void_p, C.c_size_t, Site]),
    ("em_fill__at", C.c_void_p, [C.c_void_p, C.c_double, Site]),
    ("em_to_dlpack_at", C.c_void_p, [C.c_void_p, Site]), ("em_to_dlpack_unversioned_at", C.c_void_p, [C.c_void_p, Site]),
    ("em_from_dlpack_at", C.c_void_p, [C.c_void_p, Site]), ("em_from_dlpack_unversioned_at", C.c_void_p, [C.c_void_p, Site]),
    ("em_last_error", C.c_char_p, []), ("em_debug_live_tensors", C.c_int64, []),
]:
    f = getattr(lib, name)
    f.restype, f.argtypes = res, args

capi = C.pythonapi
capi.PyCapsule_New.restype, capi.PyCapsule_New.argtypes = C.py_object, [C.c_void_p, C.c_char_p, C.c_void_p]
capi.PyCapsule_GetPointer.restype, capi.PyCapsule_GetPointer.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
capi.PyCapsule_SetName.restype, capi.PyCapsule_SetName.argtypes = C.c_int, [C.py_object, C.c_char_p]
NAMES = {True: b"dltensor_versioned", False: b"dltensor"}
USED = {True: b"used_dltensor_versioned", False: b"used_dltensor"}


def check(ok, what):
    if not ok:
        err = lib.em_last_error()
        sys.exit(f"dlpack_numpy: {what} failed: {err.decode() if err else 'no Ember error'}")


class EmberArray:
    """An Ember tensor as a DLPack producer (the two methods numpy.from_dlpack calls)."""

    def __init__(self, t):
        self.t = t

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        versioned = max_version is not None and max_version[0] >= 1
        m = (lib.em_to_dlpack_at if versioned else lib.em_to_dlpack_unversioned_at)(self.t, HERE)
        check(m, "em_to_dlpack")
        self.versioned = versioned
        # No capsule destructor: the consumer takes it at once and calls the deleter itself.
        return capi.PyCapsule_New(m, NAMES[versioned], None)


def main():
    check(lib.em_scope_begin_at(HERE), "scope")
    # Ember -> NumPy: a transposed (non-contiguous) view
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    shape = (C.c_int64 * 2)(2, 3)
    t = lib.em_from_data_at(src.ctypes.data, EM_F32, 2, shape, HERE)
    tt = lib.em_transpose_at(t, 0, 1, HERE)
    check(t and tt, "em_from_data")
    prod = EmberArray(tt)
    a = np.from_dlpack(prod)
    assert a.shape == (3, 2) and a.dtype == np.float32 and (a == src.T).all(), a
    assert a.strides == (4, 12), a.strides  # Ember's strides, not a copy's
    lib.em_fill__at(t, 5.0, HERE)
    assert (a == 5).all(), "NumPy sees Ember's write: no copy"
    print(f"Ember -> numpy {np.__version__}: {'versioned 1.0' if prod.versioned else 'pre-1.0'} struct, zero copy")
    live = lib.em_debug_live_tensors()
    lib.em_scope_end_at(HERE)
    after_scope = lib.em_debug_live_tensors()
    assert after_scope >= 1, "the export keeps the tensor alive while NumPy holds it"
    del a, prod
    assert lib.em_debug_live_tensors() == 0, f"{lib.em_debug_live_tensors()} tensors alive after NumPy let go"
    # NumPy -> Ember: a strided f64 view
    check(lib.em_scope_begin_at(HERE), "scope")
    b = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    try:
        cap, versioned = b.__dlpack__(max_version=(1, 0)), True
    except TypeError:  # NumPy before 2.1 knows only the pre-1.0 struct
        cap, versioned = b.__dlpack__(), False
    ptr = capi.PyCapsule_GetPointer(cap, NAMES[versioned])
    capi.PyCapsule_SetName(cap, USED[versioned])  # the consumer's mark: NumPy will not free it
    e = (lib.em_from_dlpack_at if versioned else lib.em_from_dlpack_unversioned_at)(ptr, HERE)
    check(e, "em_from_dlpack")
    out = (C.c_double * 6)()
    check(lib.em_to_buffer_at(e, EM_F64, out, C.sizeof(out), HERE), "em_to_buffer")
    assert list(out) == [0, 2, 4, 6, 8, 10], list(out)
    b[0, 0] = -1
    check(lib.em_to_buffer_at(e, EM_F64, out, C.sizeof(out), HERE), "em_to_buffer")
    assert out[0] == -1, "Ember sees NumPy's write: no copy"
    import gc
    import weakref
    base = b.base
    while getattr(base, "base", None) is not None:
        base = base.base
    ref = weakref.ref(base)
    del b, cap, base
    gc.collect()
    held = ref() is not None
    lib.em_scope_end_at(HERE)  # the deleter runs: NumPy's buffer may go
    gc.collect()
    assert held and ref() is None, "Ember held NumPy's array, and released it through the deleter"
    lib.em_thread_cleanup()
    assert lib.em_debug_live_tensors() == 0
    print(f"numpy {np.__version__} -> Ember: {'versioned 1.0' if versioned else 'pre-1.0'} struct, zero copy, deleter ran")


main()
