// The kvmm Python module's integer-array arguments (ids, tokens, per-request counts): a
// C-contiguous numpy array of the target dtype passes without a copy; other integer arrays
// and sequences are checked and converted once, O(n). Floats, bools, strings and values out
// of the target's range are refused naming the argument and the index: a silent cast would
// act on another request or store another token.
#include "args.hpp"

#include "kvmm/error.hpp"

#include <fmt/format.h>

#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace kvmm::py_bind {

namespace {

std::string type_name(const py::handle& v) { return py::str(py::type::handle_of(v).attr("__name__")); }

}  // namespace

bool is_bool(const py::handle& v) {
  if (PyBool_Check(v.ptr())) return true;
  const std::string_view t = Py_TYPE(v.ptr())->tp_name;  // no Python object made: O(1)
  return t == "numpy.bool_" || t == "numpy.bool";
}

namespace {

std::string short_repr(const py::handle& v) {
  std::string s = py::repr(v);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

template <class T>
[[noreturn]] void overflow(const char* what, std::size_t i, const std::string& value) {
  PyErr_SetString(
      PyExc_OverflowError,
      fmt::format("{}[{}] = {}: out of range [0, {}]", what, i, value, std::numeric_limits<T>::max()).c_str());
  throw py::error_already_set();
}

// One element of a sequence: a Python int (or numpy integer scalar), not a bool.
template <class T>
T element(const py::handle& v, const char* what, std::size_t i) {
  if (PyLong_CheckExact(v.ptr())) {  // an int (not a bool): no object made
    const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
    if (PyErr_Occurred() == nullptr && x <= std::numeric_limits<T>::max()) return static_cast<T>(x);
    PyErr_Clear();
    overflow<T>(what, i, py::str(v).cast<std::string>());
  }
  if (is_bool(v) || PyFloat_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
    throw py::type_error(fmt::format("{}[{}] = {}: expected an int, got {}", what, i, short_repr(v), type_name(v)));
  const py::int_ n = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
  if (!n) throw py::error_already_set();
  if (n < py::int_(0) || n > py::int_(std::numeric_limits<T>::max()))
    overflow<T>(what, i, py::str(py::handle(n)).cast<std::string>());
  return n.cast<T>();
}

// Checks that every value of a 1-D integer array of element type S fits T; the first that
// does not raises OverflowError naming its index.
template <class T, class S>
void check_fits(const py::array& a, const char* what) {
  const auto c = py::array_t<S, py::array::c_style>::ensure(a);  // same kind and width: exact
  if (!c) throw py::type_error(fmt::format("{}: cannot read the array as {}-byte integers", what, sizeof(S)));
  const S* d = c.data();
  for (py::ssize_t i = 0; i < c.size(); ++i) {
    const S v = d[i];
    bool bad = false;
    if constexpr (std::is_signed_v<S>) bad = v < 0;
    if constexpr (sizeof(S) > sizeof(T)) bad = bad || static_cast<std::uint64_t>(v) > std::numeric_limits<T>::max();
    if (bad) overflow<T>(what, static_cast<std::size_t>(i), std::to_string(v));
  }
}

template <class T>
void check_array(const py::array& a, const char* what) {
  const py::dtype dt = a.dtype();
  const char kind = dt.kind();
  if (kind != 'i' && kind != 'u') {
    if (a.size() == 0) return;  // np.array([]) is float64: no value to misread
    throw py::type_error(fmt::format("{}: expected an integer array, got dtype {} ({}[0] = {})", what,
                                     py::str(py::handle(dt)).cast<std::string>(), what,
                                     short_repr(a.attr("ravel")().attr("__getitem__")(0))));
  }
  const auto size = dt.itemsize();
  if (kind == 'u') {
    if (size <= static_cast<py::ssize_t>(sizeof(T))) return;
    check_fits<T, std::uint64_t>(a, what);
    return;
  }
  switch (size) {
    case 1:
      check_fits<T, std::int8_t>(a, what);
      return;
    case 2:
      check_fits<T, std::int16_t>(a, what);
      return;
    case 4:
      check_fits<T, std::int32_t>(a, what);
      return;
    default:
      check_fits<T, std::int64_t>(a, what);
      return;
  }
}

}  // namespace

template <class T>
py::array_t<T> int_array(const py::handle& obj, const char* what) {
  using Out = py::array_t<T, py::array::c_style | py::array::forcecast>;
  if (py::isinstance<py::array>(obj)) {
    const auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.ndim() != 1) fail("{}: expected a 1-D array, got {} dimensions", what, a.ndim());
    if (a.dtype().kind() == 'O') return int_array<T>(a.attr("tolist")(), what);  // Python ints, checked each
    if (py::array_t<T, py::array::c_style>::check_(a)) return py::reinterpret_borrow<py::array_t<T>>(obj);  // no copy
    check_array<T>(a, what);
    auto out = Out::ensure(a);  // every value fits: the cast is exact
    if (!out) throw py::type_error(fmt::format("{}: cannot convert the array to {}-byte integers", what, sizeof(T)));
    return out;
  }
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr()))
    throw py::type_error(fmt::format("{}: expected an integer array or sequence, got {}", what, type_name(obj)));
  if (PyObject_CheckBuffer(obj.ptr()) || py::hasattr(obj, "__array__")) {  // array.array, memoryview, a tensor
    const py::array a = py::array::ensure(obj);
    if (!a) throw py::type_error(fmt::format("{}: cannot read a {} as an array", what, type_name(obj)));
    return int_array<T>(a, what);
  }
  if (!PySequence_Check(obj.ptr()))
    throw py::type_error(fmt::format("{}: expected an integer array or sequence, got {}", what, type_name(obj)));
  const auto seq = py::reinterpret_borrow<py::sequence>(obj);
  const std::size_t n = seq.size();
  py::array_t<T> out(static_cast<py::ssize_t>(n));
  T* d = out.mutable_data();
  for (std::size_t i = 0; i < n; ++i) {
    const py::object v = seq[i];
    if (PySequence_Check(v.ptr()) && !PyUnicode_Check(v.ptr()))
      fail("{}: expected a 1-D sequence, {}[{}] is a {}", what, what, i, type_name(v));
    d[i] = element<T>(v, what, i);
  }
  return out;
}

template <class T>
T int_scalar(const py::handle& v, const char* what) {
  if (is_bool(v) || PyFloat_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
    throw py::type_error(fmt::format("{} = {}: expected an int, got {}", what, short_repr(v), type_name(v)));
  const py::int_ n = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
  if (!n) throw py::error_already_set();
  if (n < py::int_(0) || n > py::int_(std::numeric_limits<T>::max())) {
    PyErr_SetString(PyExc_OverflowError,
                    fmt::format("{} = {}: out of range [0, {}]", what, py::str(py::handle(n)).cast<std::string>(),
                                std::numeric_limits<T>::max())
                        .c_str());
    throw py::error_already_set();
  }
  return n.cast<T>();
}

template py::array_t<std::uint32_t> int_array<std::uint32_t>(const py::handle&, const char*);
template py::array_t<std::uint64_t> int_array<std::uint64_t>(const py::handle&, const char*);
template std::uint32_t int_scalar<std::uint32_t>(const py::handle&, const char*);
template std::uint64_t int_scalar<std::uint64_t>(const py::handle&, const char*);

}  // namespace kvmm::py_bind
