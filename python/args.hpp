// The kvmm Python module's integer arguments: ids, tokens and per-request counts, checked at
// the boundary (args.cpp). An array of the target dtype crosses without a copy (O(1)); any
// other integer array or sequence is checked and converted once (O(n)).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>

namespace kvmm::py_bind {

namespace py = pybind11;

// A 1-D C-contiguous array of T (uint32 or uint64) holding exactly the values of `obj`: a
// numpy array of T (C-contiguous: itself, no copy), another integer array (any width, signed
// or not; object arrays of ints), or a sequence of ints (list, tuple, range, array.array).
// TypeError for floats, bools, strings and other non-integers; OverflowError for a value
// out of [0, max T]; each names `what` and the index (`tokens[2] = -1: ...`). kvmm.Error for
// more than one dimension. An empty array of any dtype is an empty batch.
template <class T>
py::array_t<T> int_array(const py::handle& obj, const char* what);

// One int (or numpy integer scalar) that fits T: TypeError for a float, bool or string,
// OverflowError out of range, naming `what` and the value.
template <class T>
T int_scalar(const py::handle& v, const char* what);

// A scalar argument of a bound call (a handle, a token, a count, a group): an int or an
// object with __index__ (numpy integers) whose value fits T. pybind11's own integer caster
// also takes bools and truncates whatever int() takes (numpy.float32(3.9) -> 3,
// Fraction(7, 2) -> 3); this one refuses them, and values out of range, with pybind11's
// TypeError that lists the signature. Converts to T implicitly.
template <class T>
struct Int {
  T value = 0;
  operator T() const { return value; }  // NOLINT(google-explicit-constructor): a drop-in for T
};

// Whether `v` is a bool (Python's or numpy's, whose __index__ numpy 1.24 still has).
bool is_bool(const py::handle& v);

}  // namespace kvmm::py_bind

namespace pybind11::detail {

template <class T>
struct type_caster<kvmm::py_bind::Int<T>> {
  PYBIND11_TYPE_CASTER(kvmm::py_bind::Int<T>, const_name("int"));
  bool load(handle src, bool /*convert*/) {
    if (src && PyLong_CheckExact(src.ptr())) {  // an int (not a bool): the common case, no object made
      const unsigned long long v = PyLong_AsUnsignedLongLong(src.ptr());
      if (PyErr_Occurred() != nullptr) {  // negative or past 2^64
        PyErr_Clear();
        return false;
      }
      if (v > std::numeric_limits<T>::max()) return false;
      value.value = static_cast<T>(v);
      return true;
    }
    if (!src || PyFloat_Check(src.ptr()) || !PyIndex_Check(src.ptr()) || kvmm::py_bind::is_bool(src)) return false;
    const object n = reinterpret_steal<object>(PyNumber_Index(src.ptr()));
    if (!n) {
      PyErr_Clear();
      return false;
    }
    int overflow = 0;
    const long long signed_value = PyLong_AsLongLongAndOverflow(n.ptr(), &overflow);
    if (overflow < 0 || (overflow == 0 && signed_value < 0)) return false;  // negative
    const unsigned long long v = PyLong_AsUnsignedLongLong(n.ptr());
    if (PyErr_Occurred() != nullptr) {  // past 2^64
      PyErr_Clear();
      return false;
    }
    if (v > std::numeric_limits<T>::max()) return false;
    value.value = static_cast<T>(v);
    return true;
  }
  static handle cast(kvmm::py_bind::Int<T> v, return_value_policy, handle) {
    return PyLong_FromUnsignedLongLong(v.value);
  }
};

}  // namespace pybind11::detail
