// Error types of the native core. They are bound to Python as exception
// classes (hora.HoraError and its subclass hora.HoraInternalError), so the
// hierarchy here is the hierarchy users catch.
#pragma once

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace hora {

// Raised when a collective cannot be carried out for a reason that concerns
// the whole job (as opposed to bad arguments, which are std::invalid_argument).
class HoraError : public std::runtime_error {
 public:
  explicit HoraError(const std::string& what) : std::runtime_error(what) {}
};

// Raised when communication with a peer fails: the peer closed its
// connection, died, sent bytes that do not belong to the protocol, or did not
// make progress within the timeout. After this error the transport is broken
// and every later request on it fails at once with the same cause.
class HoraInternalError : public HoraError {
 public:
  explicit HoraInternalError(const std::string& what) : HoraError(what) {}
};

// Raised on every member of a process set when the ranks' requests for one
// collective cannot run together: they disagree on its arguments (shape,
// dtype, op, root, scale factors), or it is not supported while some ranks
// have joined. The job goes on. It is a bad argument (ValueError in Python)
// that Horovod's users catch as a RuntimeError, so it is bound as both.
class RequestError : public std::invalid_argument {
 public:
  explicit RequestError(const std::string& what) : std::invalid_argument(what) {}
};

// "30 s", "0.25 s": a duration for messages.
inline std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

}  // namespace hora
