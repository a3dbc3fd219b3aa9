// What both halves of the Python binding (bindings.cc, bindings_engine.cc)
// need: argument checks that quote the values they refuse, and the hook
// that lets Ctrl-C interrupt a wait.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "dtypes.h"

namespace hora::bindings {

namespace py = pybind11;

inline std::chrono::milliseconds to_millis(double seconds, const char* what) {
  if (!(seconds > 0)) {
    throw std::invalid_argument(std::string(what) + " must be a positive number of seconds, got " +
                                std::to_string(seconds) + ".");
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

// Checks that a buffer is C-contiguous and returns its description.
inline py::buffer_info contiguous(const py::buffer& buffer, bool writable, const char* what) {
  py::buffer_info info = buffer.request(writable);
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t dim = info.ndim - 1; dim >= 0; --dim) {
    if (info.shape[dim] > 1 && info.strides[dim] != expected) {
      throw std::invalid_argument(std::string(what) + " must be C-contiguous; make a contiguous copy first "
                                                      "(numpy.ascontiguousarray).");
    }
    expected *= info.shape[dim];
  }
  return info;
}

inline std::size_t element_count(const py::buffer_info& info, DataType dtype, const char* what) {
  if (static_cast<std::size_t>(info.itemsize) != element_size(dtype)) {
    throw std::invalid_argument(std::string(what) + " has items of " + std::to_string(info.itemsize) +
                                " bytes but dtype " + to_string(dtype) + " has items of " +
                                std::to_string(element_size(dtype)) + " bytes.");
  }
  return static_cast<std::size_t>(info.size);
}

// Whether two buffers of `bytes` bytes share memory without being the same
// buffer: an allreduce's output must be its input itself (in place) or
// memory of its own, since the ring reads the input while it writes the output.
inline bool overlaps_partly(const void* input, const void* output, std::size_t bytes) {
  const auto in = reinterpret_cast<std::uintptr_t>(input);
  const auto out = reinterpret_cast<std::uintptr_t>(output);
  return in != out && in < out + bytes && out < in + bytes;
}

inline int positive(int value, const char* what) {
  if (value < 1) throw std::invalid_argument(std::string(what) + " must be at least 1, got " + std::to_string(value) + ".");
  return value;
}

// A duration where 0 means "off".
inline std::chrono::milliseconds optional_millis(double seconds, const char* what) {
  if (!(seconds >= 0)) {
    throw std::invalid_argument(std::string(what) + " must be >= 0 seconds (0 turns it off), got " +
                                std::to_string(seconds) + ".");
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

// Runs Python's signal handlers from a wait (every 100 ms), so that Ctrl-C
// interrupts it.
inline void check_signals() {
  py::gil_scoped_acquire acquire;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// Binds the engine and its requests (bindings_engine.cc).
void bind_engine(py::module_& m);

}  // namespace hora::bindings
