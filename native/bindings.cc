// The Python binding of the native core, imported as hora._native: this
// file and bindings_engine.cc (with bindings_common.h, what both use) are the
// only ones that know about pybind11. Every entry point that moves
// data releases the GIL for the whole collective and works on the caller's
// buffer in place (numpy arrays or anything else with the buffer protocol).
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings_common.h"
#include "collectives.h"
#include "engine.h"
#include "errors.h"
#include "hmac.h"
#include "huge_pages.h"
#include "loopback_transport.h"
#include "mesh_transport.h"
#include "warnings.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace hora {
namespace {

using bindings::contiguous;
using bindings::element_count;
using bindings::overlaps_partly;
using bindings::to_millis;

std::size_t byte_count(const py::buffer_info& info) {
  return static_cast<std::size_t>(info.size) * static_cast<std::size_t>(info.itemsize);
}

void check_total(std::size_t have, const std::vector<std::size_t>& parts, const char* what) {
  std::size_t total = 0;
  for (std::size_t part : parts) total += part;
  if (total != have) {
    throw std::invalid_argument(std::string(what) + ": the counts add up to " + std::to_string(total) +
                                " but the buffer holds " + std::to_string(have) + ".");
  }
}

void check_loopback_pair(const LoopbackGroup& group, int src, int dst) {
  for (const int rank : {src, dst}) {
    if (rank < 0 || rank >= group.size()) {
      throw std::invalid_argument("Rank " + std::to_string(rank) + " is not in this loopback group of size " +
                                  std::to_string(group.size()) + ".");
    }
  }
}

}  // namespace
}  // namespace hora

PYBIND11_MODULE(_native, m) {
  using namespace hora;
  m.doc() = "Hora's compiled core: transports and collectives. Private; use the hora package.";

  py::enum_<DataType>(m, "DataType", "Element type of a buffer passed to a collective.")
      .value("UINT8", DataType::kUInt8)
      .value("INT8", DataType::kInt8)
      .value("INT16", DataType::kInt16)
      .value("INT32", DataType::kInt32)
      .value("INT64", DataType::kInt64)
      .value("FLOAT16", DataType::kFloat16)
      .value("BFLOAT16", DataType::kBFloat16)
      .value("FLOAT32", DataType::kFloat32)
      .value("FLOAT64", DataType::kFloat64)
      .value("BOOL", DataType::kBool);

  py::enum_<ReduceOp>(m, "ReduceOp", "Reduction applied by allreduce and reducescatter.")
      .value("SUM", ReduceOp::kSum)
      .value("AVERAGE", ReduceOp::kAverage)
      .value("MIN", ReduceOp::kMin)
      .value("MAX", ReduceOp::kMax)
      .value("PRODUCT", ReduceOp::kProduct);

  static py::exception<HoraError> hora_error(m, "HoraError", PyExc_RuntimeError);
  static py::exception<HoraInternalError> internal_error(m, "HoraInternalError", hora_error.ptr());
  static py::exception<RequestError> request_error(m, "RequestError",
                                                   py::make_tuple(hora_error, py::handle(PyExc_ValueError)));
  hora_error.attr("__doc__") =
      "The base of Hora's errors (a RuntimeError): a collective, the job or its set-up failed.";
  internal_error.attr("__doc__") =
      "Communication with a peer failed: it died, stopped making progress or shut the job down. Horovod's "
      "HorovodInternalError; hora.elastic.run recovers from it.";
  request_error.attr("__doc__") =
      "The ranks' requests for one collective disagree (shape, dtype, op, root rank, scale factors), or it cannot "
      "run (a root outside its process set; an allgather while ranks have joined). Raised on every rank; the job "
      "goes on. Also a ValueError.";
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const HoraInternalError& e) {
      py::set_error(internal_error, e.what());
    } catch (const HoraError& e) {
      py::set_error(hora_error, e.what());
    } catch (const RequestError& e) {
      py::set_error(request_error, e.what());
    }
  });

  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport",
                                                    "Connections to the other ranks of one job. Not thread-safe.")
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("size", &Transport::size)
      .def_property_readonly("timeout", [](const Transport& t) { return t.timeout().count() / 1000.0; })
      .def("abort", &Transport::abort, "reason"_a, py::call_guard<py::gil_scoped_release>());

  py::class_<TcpListener>(m, "TcpListener", "A listening socket whose port is published at rendezvous.")
      .def(py::init<const std::string&, int>(), "host"_a = "127.0.0.1", "port"_a = 0)
      .def_property_readonly("host", &TcpListener::host)
      .def_property_readonly("port", &TcpListener::port)
      .def("close", &TcpListener::close);

  py::class_<MeshTransport, Transport, std::shared_ptr<MeshTransport>>(
      m, "MeshTransport", "The links of a real job: shared memory within a host, TCP between hosts.")
      .def("links", &MeshTransport::links, "\"shm\", \"tcp\" or \"self\" for every rank.")
      .def("single_copy", &MeshTransport::single_copy,
           "For every rank, whether its link passes large messages by reference (shared memory only).")
      .def("sent_by_reference", &MeshTransport::sent_by_reference,
           "For every rank, how many messages this rank has passed to it by reference so far (a diagnostic: read it\n"
           "while no collective runs).");

  m.def(
      "connect",
      [](TcpListener& listener, int rank, const std::vector<std::pair<std::string, int>>& peers,
         const py::bytes& secret, double connect_timeout, double timeout, const std::vector<int>& hosts,
         bool shared_memory, bool single_copy, std::size_t single_copy_buffer_bytes) -> std::shared_ptr<MeshTransport> {
        std::vector<PeerAddress> addresses;
        for (const auto& peer : peers) addresses.push_back(PeerAddress{peer.first, peer.second});
        const std::string key = secret;
        const auto connect_ms = to_millis(connect_timeout, "connect_timeout");
        const auto timeout_ms = to_millis(timeout, "timeout");
        py::gil_scoped_release release;
        return MeshTransport::connect(listener, rank, addresses, hosts, shared_memory, single_copy, key, connect_ms,
                                      timeout_ms, single_copy_buffer_bytes);
      },
      "listener"_a, "rank"_a, "peers"_a, "secret"_a, "connect_timeout"_a, "timeout"_a,
      "hosts"_a = std::vector<int>{}, "shared_memory"_a = true, "single_copy"_a = true,
      "single_copy_buffer_bytes"_a = kSingleCopyBufferBytes,
      "Connects to every peer. Ranks with equal entries in hosts share memory (unless shared_memory is\n"
      "false on either side); the others, or all when hosts is empty, use TCP. A shared-memory pair\n"
      "passes large messages of buffers from single_copy_buffer_bytes by reference unless single_copy is\n"
      "false on either side or the system forbids it; every rank must give the same single_copy_buffer_bytes\n"
      "(the default; tests lower it), or the set-up fails naming both.");

  py::class_<LoopbackGroup, std::shared_ptr<LoopbackGroup>>(m, "LoopbackGroup",
                                                            "An in-process world whose ranks are threads.")
      .def(py::init([](int size, double timeout) {
             return std::make_shared<LoopbackGroup>(size, to_millis(timeout, "timeout"));
           }),
           "size"_a, "timeout"_a = 30.0)
      .def_property_readonly("size", &LoopbackGroup::size)
      .def("transport", [](LoopbackGroup& group, int rank) -> std::shared_ptr<Transport> {
        return group.transport(rank);
      }, "rank"_a)
      .def(
          "push",
          [](LoopbackGroup& group, int src, int dst, const py::buffer& message) {
            check_loopback_pair(group, src, dst);
            const py::buffer_info info = contiguous(message, false, "The message");
            group.push(src, dst, info.ptr, byte_count(info));
          },
          "src"_a, "dst"_a, "message"_a,
          "Queues `message` as the next message from rank src to rank dst, as src's transport would send it\n"
          "(a scripted peer in tests).")
      .def(
          "pop",
          [](LoopbackGroup& group, int src, int dst) {
            check_loopback_pair(group, src, dst);
            std::vector<char> message;
            {
              py::gil_scoped_release release;
              message = group.pop(src, dst);
            }
            return py::bytes(message.data(), message.size());
          },
          "src"_a, "dst"_a,
          "Takes the next message from rank src to rank dst, as dst's transport would receive it, waiting up to\n"
          "the group's timeout (then HoraInternalError, and the group is aborted).");

  m.def(
      "allreduce",
      [](Transport& transport, const py::buffer& buffer, DataType dtype, ReduceOp op, double prescale,
         double postscale, const std::optional<py::buffer>& output) {
        const py::buffer_info info = contiguous(buffer, !output, "The allreduce buffer");
        const std::size_t count = element_count(info, dtype, "The allreduce buffer");
        void* result = info.ptr;
        std::optional<py::buffer_info> out;
        if (output) {
          out = contiguous(*output, true, "The allreduce output");
          const std::size_t items = element_count(*out, dtype, "The allreduce output");
          if (items != count) {
            throw std::invalid_argument("The allreduce output has " + std::to_string(items) + " items; the buffer has " +
                                        std::to_string(count) + ".");
          }
          if (overlaps_partly(info.ptr, out->ptr, count * element_size(dtype))) {
            throw std::invalid_argument("The allreduce output overlaps the buffer; pass memory of its own.");
          }
          result = out->ptr;
        }
        py::gil_scoped_release release;
        allreduce(transport, info.ptr, result, count, dtype, op, prescale, postscale);
      },
      "transport"_a, "buffer"_a, "dtype"_a, "op"_a, "prescale"_a = 1.0, "postscale"_a = 1.0, "output"_a = py::none());

  m.def(
      "reducescatter",
      [](Transport& transport, const py::buffer& buffer, const std::vector<std::size_t>& counts, DataType dtype,
         ReduceOp op, double prescale, double postscale) {
        const py::buffer_info info = contiguous(buffer, true, "The reducescatter buffer");
        check_total(element_count(info, dtype, "The reducescatter buffer"), counts, "reducescatter");
        py::gil_scoped_release release;
        reducescatter(transport, info.ptr, counts, dtype, op, prescale, postscale);
      },
      "transport"_a, "buffer"_a, "counts"_a, "dtype"_a, "op"_a, "prescale"_a = 1.0, "postscale"_a = 1.0);

  m.def(
      "allgather",
      [](Transport& transport, const py::buffer& input, const py::buffer& output,
         const std::vector<std::size_t>& byte_counts) {
        const py::buffer_info in = contiguous(input, false, "The allgather input");
        const py::buffer_info out = contiguous(output, true, "The allgather output");
        check_total(byte_count(out), byte_counts, "allgather");
        if (byte_counts.size() == static_cast<std::size_t>(transport.size()) &&
            byte_count(in) != byte_counts[transport.rank()]) {
          throw std::invalid_argument("allgather: the input holds " + std::to_string(byte_count(in)) +
                                      " bytes but this rank's count is " +
                                      std::to_string(byte_counts[transport.rank()]) + ".");
        }
        py::gil_scoped_release release;
        allgather(transport, in.ptr, out.ptr, byte_counts);
      },
      "transport"_a, "input"_a, "output"_a, "byte_counts"_a);

  m.def(
      "broadcast",
      [](Transport& transport, const py::buffer& buffer, int root) {
        const py::buffer_info info = contiguous(buffer, true, "The broadcast buffer");
        py::gil_scoped_release release;
        broadcast(transport, info.ptr, byte_count(info), root);
      },
      "transport"_a, "buffer"_a, "root"_a);

  m.def(
      "alltoall",
      [](Transport& transport, const py::buffer& input, const std::vector<std::size_t>& send_bytes,
         const py::buffer& output, const std::vector<std::size_t>& recv_bytes) {
        const py::buffer_info in = contiguous(input, false, "The alltoall input");
        const py::buffer_info out = contiguous(output, true, "The alltoall output");
        check_total(byte_count(in), send_bytes, "alltoall send splits");
        check_total(byte_count(out), recv_bytes, "alltoall receive splits");
        py::gil_scoped_release release;
        alltoall(transport, in.ptr, send_bytes, out.ptr, recv_bytes);
      },
      "transport"_a, "input"_a, "send_bytes"_a, "output"_a, "recv_bytes"_a);

  m.def("barrier", [](Transport& transport) { barrier(transport); }, "transport"_a,
        py::call_guard<py::gil_scoped_release>());

  m.def(
      "on_huge_pages",
      [](const py::buffer& buffer) {
        const py::buffer_info info = contiguous(buffer, false, "The buffer");
        return on_huge_pages(info.ptr, byte_count(info));
      },
      "buffer"_a,
      "Whether at least half of the buffer lies on huge pages, as the kernel's page tables say now; None where\n"
      "the kernel cannot say (before Linux 6.7). A shared-memory link passes a large message by reference only\n"
      "from huge pages (huge_pages.h).");

  bindings::bind_engine(m);

  m.def("set_warnings_drained", &set_warnings_drained, "drained"_a,
        "Queue the native core's warnings for take_warnings() (True) or write them to stderr (False).");
  m.def(
      "take_warnings",
      [](double wait) {
        std::vector<std::string> taken;
        {
          py::gil_scoped_release release;
          taken = take_warnings(std::chrono::milliseconds(static_cast<long long>(std::max(0.0, wait) * 1000.0)));
        }
        return taken;
      },
      "wait"_a, "Waits up to `wait` seconds for the native core's queued warnings and returns them, oldest first.");

  m.def(
      "hmac_sha256",
      [](const py::bytes& key, const py::bytes& message) {
        const std::string k = key;
        const std::string msg = message;
        const Digest digest = hmac_sha256(k, msg.data(), msg.size());
        return py::bytes(reinterpret_cast<const char*>(digest.data()), digest.size());
      },
      "key"_a, "message"_a, "HMAC-SHA256 as used by the connection handshake (exposed for tests).");
}
