// The kvmm Python module's integer arguments: ids, tokens and per-request counts, checked at
// the boundary (args.cpp). An array of the target dtype crosses without a copy (O(1)); any
// other integer array or sequence is checked and converted once (O(n)).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>

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

}  // namespace kvmm::py_bind
