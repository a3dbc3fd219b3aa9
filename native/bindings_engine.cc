// The binding of the engine: its requests and results, options and
// parameters, and the Engine class itself (hora._native.Engine). The rest
// of hora._native is in bindings.cc.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings_common.h"
#include "engine.h"

using namespace pybind11::literals;

namespace hora::bindings {
namespace {

// Views of the buffers of requests in flight.
//
// A submission owns a view of its caller's buffer (a Py_buffer, which holds
// a reference to the object that exports it), so the memory stays valid for
// as long as the engine may touch it, even when the caller drops its handle
// or the job fails. Releasing a view needs the GIL, but submissions die on
// the engine's threads, which never take the GIL (they hold engine locks that
// Python threads wait for). A view released there is parked, and the next
// call into this module that holds the GIL releases it. The parking lot is
// never destroyed: after the interpreter is gone, parked views are leaked,
// not released.
class ParkedViews {
 public:
  static ParkedViews& instance() {
    static ParkedViews* parked = new ParkedViews();
    return *parked;
  }

  std::shared_ptr<const void> own(py::buffer_info view) {
    return std::shared_ptr<const void>(new py::buffer_info(std::move(view)), [this](const void* pointer) {
      auto* owned = static_cast<py::buffer_info*>(const_cast<void*>(pointer));
      if (Py_IsInitialized() && PyGILState_Check()) {
        delete owned;
        return;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      views_.push_back(owned);
    });
  }

  // With the GIL held: releases the views parked so far.
  void release() {
    std::vector<py::buffer_info*> views;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      views.swap(views_);
    }
    for (py::buffer_info* view : views) delete view;
  }

 private:
  std::mutex mutex_;  // a leaf: nothing else is locked while it is held
  std::vector<py::buffer_info*> views_;
};

// What Python asks the engine for, bound as hora._native.Request: one
// tensor's request with named fields. The element type and shape are read
// from the buffer unless `dtype` is given (bfloat16 travels as 2-byte
// integers, which only the caller can name).
struct PythonRequest {
  RequestKind kind = RequestKind::kAllreduce;
  std::string name;
  py::object buffer = py::none();
  std::optional<DataType> dtype;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int root = -1;
  int process_set = 0;
  std::vector<int64_t> splits;  // alltoall: rows sent to each member
  std::vector<int32_t> ranks;   // add_process_set: the members; remove_process_set: {set id}
  py::object output = py::none();  // allreduce out of place: where the result goes (`buffer` is only read)
};

// The element type a buffer's struct format names ("f", "<i8", ...), if Hora reduces it.
std::optional<DataType> format_type(const std::string& format, py::ssize_t itemsize) {
  std::size_t at = 0;
  if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<' || format[0] == '|')) at = 1;
  if (format.size() != at + 1) return std::nullopt;
  switch (format[at]) {
    case '?': return DataType::kBool;
    case 'b': return DataType::kInt8;
    case 'B': return DataType::kUInt8;
    case 'h': return DataType::kInt16;
    case 'e': return DataType::kFloat16;
    case 'f': return DataType::kFloat32;
    case 'd': return DataType::kFloat64;
    case 'i': case 'l': case 'q':
      if (itemsize == 4) return DataType::kInt32;
      if (itemsize == 8) return DataType::kInt64;
      return std::nullopt;
    default: return std::nullopt;
  }
}

// The engine's submission for a request; it owns a view of the buffer (see ParkedViews).
Submission make_submission(const PythonRequest& given, const std::string& group, int group_size) {
  Submission submission;
  Request& request = submission.request;
  request.name = given.name;
  request.kind = given.kind;
  request.process_set = given.process_set;
  request.op = given.op;
  request.prescale = given.prescale;
  request.postscale = given.postscale;
  request.root = given.root;
  request.group = group;
  request.group_size = group_size;
  request.ranks = given.ranks;
  submission.splits = given.splits;
  if (given.buffer.is_none()) return submission;
  const bool out_of_place = !given.output.is_none();
  if (out_of_place && given.kind != RequestKind::kAllreduce) {
    throw std::invalid_argument("Only an allreduce takes an output buffer; request '" + given.name + "' is a " +
                                to_string(given.kind) + ".");
  }
  const bool in_place = (given.kind == RequestKind::kAllreduce || given.kind == RequestKind::kBroadcast) &&
                        !out_of_place;
  py::buffer_info info = contiguous(given.buffer.cast<py::buffer>(), in_place, "The tensor");
  if (given.dtype) {
    request.dtype = *given.dtype;
    element_count(info, request.dtype, "The tensor");
  } else {
    const std::optional<DataType> found = format_type(info.format, info.itemsize);
    if (!found) {
      throw std::invalid_argument("The tensor of request '" + given.name + "' has items of buffer format '" +
                                  info.format + "' (" + std::to_string(info.itemsize) +
                                  " bytes), which Hora does not reduce; expected native-order bool, int8, uint8, "
                                  "int16, int32, int64, float16, float32 or float64 (bfloat16: its 2-byte bits with "
                                  "dtype=BFLOAT16).");
    }
    request.dtype = *found;
  }
  request.shape.assign(info.shape.begin(), info.shape.end());
  submission.buffer = info.ptr;
  if (!out_of_place) {
    submission.owner = ParkedViews::instance().own(std::move(info));
    return submission;
  }
  py::buffer_info output = contiguous(given.output.cast<py::buffer>(), true, "The output");
  const std::size_t bytes = static_cast<std::size_t>(info.size * info.itemsize);
  if (output.itemsize != info.itemsize || output.size != info.size) {
    throw std::invalid_argument("The output of request '" + given.name + "' has " + std::to_string(output.size) +
                                " items of " + std::to_string(output.itemsize) + " bytes; its tensor has " +
                                std::to_string(info.size) + " of " + std::to_string(info.itemsize) + ".");
  }
  if (!given.dtype && format_type(output.format, output.itemsize) != request.dtype) {
    throw std::invalid_argument("The output of request '" + given.name + "' has items of buffer format '" +
                                output.format + "'; its tensor's are " + to_string(request.dtype) + ".");
  }
  if (overlaps_partly(info.ptr, output.ptr, bytes)) {
    throw std::invalid_argument("The output of request '" + given.name + "' overlaps its tensor; pass the tensor "
                                "itself (in place) or memory of its own.");
  }
  submission.input = info.ptr == output.ptr ? nullptr : info.ptr;  // the tensor itself: in place
  submission.buffer = output.ptr;
  using Views = std::pair<std::shared_ptr<const void>, std::shared_ptr<const void>>;
  submission.owner = std::make_shared<Views>(ParkedViews::instance().own(std::move(info)),
                                             ParkedViews::instance().own(std::move(output)));
  return submission;
}

std::vector<Submission> make_submissions(const std::vector<const PythonRequest*>& requests, const std::string& group) {
  std::vector<Submission> submissions;
  submissions.reserve(requests.size());
  const int group_size = group.empty() ? 0 : static_cast<int>(requests.size());
  for (const PythonRequest* request : requests) submissions.push_back(make_submission(*request, group, group_size));
  return submissions;
}

// On leaving a call into the engine, with the GIL held again (also when the
// call throws): releases the views the engine's threads parked meanwhile.
struct ReleaseParkedViews {
  ReleaseParkedViews() = default;
  ReleaseParkedViews(const ReleaseParkedViews&) = delete;
  ReleaseParkedViews& operator=(const ReleaseParkedViews&) = delete;
  ~ReleaseParkedViews() { ParkedViews::instance().release(); }
};

// Submits requests and waits for them on this thread (Engine::run), without the GIL.
template <typename Submissions>
auto run_without_gil(Engine& engine, Submissions submissions) {
  ReleaseParkedViews on_return;
  py::gil_scoped_release release;
  return engine.run(std::move(submissions), check_signals);
}

// The fast paths of an in-place allreduce or broadcast of one buffer: the
// checks and the request in one call, then its run (try_run_in_place) or its
// submission (try_submit_in_place). A small collective costs little more in
// the engine than in MPI; the Python layer around it costs as much again,
// and with more ranks than cores that CPU time is what the call takes
// (docs/performance.md). Each declines, having done nothing, when `buffer`
// is not a writable C-contiguous buffer of at most kMaxDims dimensions whose
// format names an element type Hora reduces: the request layer then takes
// its checked path, whose errors say what is wrong.
std::optional<Submission> in_place_submission(RequestKind kind, std::string name, py::handle buffer, ReduceOp op,
                                              double prescale, double postscale, int root, int process_set,
                                              const char* caller) {
  if (kind != RequestKind::kAllreduce && kind != RequestKind::kBroadcast) {
    throw std::invalid_argument(std::string(caller) + " is for an allreduce or a broadcast; got kind " +
                                to_string(kind) + ".");
  }
  auto view = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(buffer.ptr(), view.get(), PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    // Refused as asked for (no buffer, read-only, not contiguous): decline. Anything else (an interrupt or a
    // MemoryError from the exporter) is the caller's.
    if (!PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_TypeError) &&
        !PyErr_ExceptionMatches(PyExc_ValueError)) {
      throw py::error_already_set();
    }
    PyErr_Clear();
    return std::nullopt;
  }
  py::buffer_info info(view.release());  // owns the view from here on
  constexpr py::ssize_t kMaxDims = 32;
  const std::optional<DataType> dtype = format_type(info.format, info.itemsize);
  if (!dtype || info.ndim > kMaxDims) return std::nullopt;
  // The request's fields as make_submission() fills them (no splits, ranks or output); its buffer is the view
  // read here.
  const PythonRequest given{
      kind, std::move(name), py::none(), dtype, op, prescale, postscale, root, process_set, {}, {}, py::none()};
  Submission submission = make_submission(given, "", 0);
  submission.request.dtype = *dtype;
  submission.request.shape.assign(info.shape.begin(), info.shape.end());
  submission.buffer = info.ptr;
  submission.owner = ParkedViews::instance().own(std::move(info));
  return submission;
}

bool try_run_in_place(Engine& engine, RequestKind kind, std::string name, py::handle buffer, ReduceOp op,
                      double prescale, double postscale, int root, int process_set) {
  std::optional<Submission> submission = in_place_submission(kind, std::move(name), buffer, op, prescale, postscale,
                                                             root, process_set, "try_run_in_place");
  if (!submission) return false;
  run_without_gil(engine, std::move(*submission));
  return true;
}

// The handle, or -1 having done nothing (see above).
int64_t try_submit_in_place(Engine& engine, RequestKind kind, std::string name, py::handle buffer, ReduceOp op,
                            double prescale, double postscale, int root, int process_set) {
  ParkedViews::instance().release();
  std::optional<Submission> submission = in_place_submission(kind, std::move(name), buffer, op, prescale, postscale,
                                                             root, process_set, "try_submit_in_place");
  if (!submission) return -1;
  py::gil_scoped_release release;
  return engine.submit(std::move(*submission));
}

// Hands a result's bytes to numpy without a copy: the array owns a
// reference to the vector through its base capsule.
py::object as_numpy(const std::shared_ptr<std::vector<char>>& bytes) {
  if (!bytes) return py::none();
  auto* owner = new std::shared_ptr<std::vector<char>>(bytes);
  py::capsule base(owner, [](void* pointer) { delete static_cast<std::shared_ptr<std::vector<char>>*>(pointer); });
  return py::array_t<uint8_t>({static_cast<py::ssize_t>(bytes->size())}, {py::ssize_t{1}},
                              reinterpret_cast<uint8_t*>(bytes->data()), base);
}

// Waits for handles without the GIL and returns their results.
std::vector<Result> wait_for(Engine& engine, const std::vector<int64_t>& handles) {
  ReleaseParkedViews on_return;
  py::gil_scoped_release release;
  return engine.wait(handles, check_signals);
}

// An EngineOptions count that must be at least 1, as a property.
template <int AutotuneOptions::*Field>
void count_property(py::class_<EngineOptions>& options, const char* name, const char* doc) {
  options.def_property(
      name, [](const EngineOptions& o) { return o.autotune.*Field; },
      [name](EngineOptions& o, int n) { o.autotune.*Field = positive(n, name); }, doc);
}

}  // namespace

void bind_engine(py::module_& m) {
  py::enum_<RequestKind>(m, "RequestKind", "What a request submitted to the engine asks for.")
      .value("ALLREDUCE", RequestKind::kAllreduce)
      .value("ALLGATHER", RequestKind::kAllgather)
      .value("BROADCAST", RequestKind::kBroadcast)
      .value("ALLTOALL", RequestKind::kAlltoall)
      .value("REDUCESCATTER", RequestKind::kReducescatter)
      .value("BARRIER", RequestKind::kBarrier)
      .value("JOIN", RequestKind::kJoin)
      .value("ADD_PROCESS_SET", RequestKind::kAddProcessSet)
      .value("REMOVE_PROCESS_SET", RequestKind::kRemoveProcessSet);

  py::class_<PythonRequest>(m, "Request", "One tensor's request to the engine.")
      .def(py::init([](RequestKind kind, std::string name, py::object buffer, std::optional<DataType> dtype,
                       ReduceOp op, double prescale, double postscale, int root, int process_set,
                       const py::object& splits, const py::object& ranks, py::object output) {
             PythonRequest request;
             request.kind = kind;
             request.name = std::move(name);
             request.buffer = std::move(buffer);
             request.dtype = dtype;
             request.op = op;
             request.prescale = prescale;
             request.postscale = postscale;
             request.root = root;
             request.process_set = process_set;
             // Most requests have neither: skip the conversion of an empty sequence.
             if (!splits.is_none() && py::len(splits) > 0) request.splits = splits.cast<std::vector<int64_t>>();
             if (!ranks.is_none() && py::len(ranks) > 0) request.ranks = ranks.cast<std::vector<int32_t>>();
             request.output = std::move(output);
             return request;
           }),
           "kind"_a, "name"_a = "", "buffer"_a = py::none(), "dtype"_a = py::none(), "op"_a = ReduceOp::kSum,
           "prescale"_a = 1.0, "postscale"_a = 1.0, "root"_a = -1, "process_set"_a = 0, "splits"_a = py::none(),
           "ranks"_a = py::none(), "output"_a = py::none())
      .def_readwrite("kind", &PythonRequest::kind)
      .def_readwrite("name", &PythonRequest::name, "Matched across ranks.")
      .def_readwrite("buffer", &PythonRequest::buffer, "The tensor (C-contiguous, buffer protocol), or None.")
      .def_readwrite("dtype", &PythonRequest::dtype, "The element type; None reads it from the buffer's format.")
      .def_readwrite("op", &PythonRequest::op)
      .def_readwrite("prescale", &PythonRequest::prescale)
      .def_readwrite("postscale", &PythonRequest::postscale)
      .def_readwrite("root", &PythonRequest::root, "broadcast: the root (a global rank).")
      .def_readwrite("process_set", &PythonRequest::process_set)
      .def_readwrite("splits", &PythonRequest::splits, "alltoall: the rows sent to each member.")
      .def_readwrite("ranks", &PythonRequest::ranks,
                     "add_process_set: the members; remove_process_set: [the set's id].")
      .def_readwrite("output", &PythonRequest::output,
                     "allreduce: a buffer for the result (the tensor is then only read), or None for in place.");

  py::class_<Result>(m, "Result", "What a completed request hands back.")
      .def_property_readonly(
          "output", [](const Result& result) { return as_numpy(result.output); },
          "The bytes the engine allocated (allgather, alltoall, reducescatter), or None for in-place requests.")
      .def_readonly("shape", &Result::shape, "The output's shape.")
      .def_readonly("received_splits", &Result::received_splits, "alltoall: the rows received from each member.")
      .def_readonly("value", &Result::value, "join: the last rank to join; add_process_set: the new set's id.");

  py::class_<EngineOptions> options(m, "EngineOptions",
                                    "The engine's settings, with their defaults (the one place they are defined).");
  options
      .def(py::init<>())
      .def_readwrite("fusion_threshold_bytes", &EngineOptions::fusion_threshold_bytes,
                     "Tensors are fused into buffers of up to this many bytes (0: no fusion).")
      .def_property(
          "cycle_time_ms", [](const EngineOptions& o) { return o.cycle_time.count() / 1000.0; },
          [](EngineOptions& o, double ms) {
            if (!(ms >= 0)) throw std::invalid_argument("cycle_time_ms must be >= 0, got " + std::to_string(ms) + ".");
            o.cycle_time = std::chrono::microseconds(static_cast<long long>(ms * 1000.0 + 0.5));
          },
          "How long a submitted request may wait for more to fuse with before a cycle starts.")
      .def_readwrite("cache_capacity", &EngineOptions::cache_capacity, "Response cache slots (0: no cache).")
      .def_property(
          "stall_warning_seconds", [](const EngineOptions& o) { return o.stall_warning.count() / 1000.0; },
          [](EngineOptions& o, double s) { o.stall_warning = optional_millis(s, "stall_warning_seconds"); },
          "Warn about requests some ranks have not submitted after this long (0: never).")
      .def_property(
          "stall_shutdown_seconds", [](const EngineOptions& o) { return o.stall_shutdown.count() / 1000.0; },
          [](EngineOptions& o, double s) { o.stall_shutdown = optional_millis(s, "stall_shutdown_seconds"); },
          "Fail the job after a stall this long (0: never).")
      .def_property(
          "shutdown_timeout_seconds", [](const EngineOptions& o) { return o.shutdown_timeout.count() / 1000.0; },
          [](EngineOptions& o, double s) { o.shutdown_timeout = to_millis(s, "shutdown_timeout_seconds"); },
          "How long shutdown() waits for the other ranks to take part.")
      .def_readwrite("hosts", &EngineOptions::hosts, "The host number of every rank (empty: one rank per host).")
      .def_readwrite("hierarchical_allreduce", &EngineOptions::hierarchical_allreduce,
                     "On, off, or None: whenever the placement allows it.")
      .def_property(
          "autotune", [](const EngineOptions& o) { return o.autotune.enabled; },
          [](EngineOptions& o, bool on) { o.autotune.enabled = on; }, "Tune the parameters online (rank 0 decides).")
      .def_property(
          "autotune_log", [](const EngineOptions& o) { return o.autotune.log_path; },
          [](EngineOptions& o, const std::string& path) { o.autotune.log_path = path; },
          "CSV file of the autotuner's trials (written by rank 0; empty: none).")
      .def_property(
          "autotune_fixed",
          [](const EngineOptions& o) {
            std::vector<std::string> fixed;
            if (o.autotune.fusion_threshold_fixed) fixed.push_back("fusion_threshold");
            if (o.autotune.cycle_time_fixed) fixed.push_back("cycle_time");
            if (o.autotune.cache_fixed) fixed.push_back("cache");
            if (o.autotune.hierarchical_fixed) fixed.push_back("hierarchical_allreduce");
            return fixed;
          },
          [](EngineOptions& o, const std::vector<std::string>& fixed) {
            AutotuneOptions& a = o.autotune;
            a.fusion_threshold_fixed = a.cycle_time_fixed = a.cache_fixed = a.hierarchical_fixed = false;
            for (const std::string& name : fixed) {
              if (name == "fusion_threshold") a.fusion_threshold_fixed = true;
              else if (name == "cycle_time") a.cycle_time_fixed = true;
              else if (name == "cache") a.cache_fixed = true;
              else if (name == "hierarchical_allreduce") a.hierarchical_fixed = true;
              else throw std::invalid_argument("autotune_fixed: unknown parameter '" + name + "'; expected "
                                               "fusion_threshold, cycle_time, cache or hierarchical_allreduce.");
            }
          },
          "Parameters the autotuner leaves as they are (the user set them).");

  count_property<&AutotuneOptions::warmup_samples>(options, "autotune_warmup_samples",
                                                    "Samples discarded before tuning starts.");
  count_property<&AutotuneOptions::steps_per_sample>(options, "autotune_steps_per_sample", "Training steps per sample.");
  count_property<&AutotuneOptions::samples_per_trial>(
      options, "autotune_samples_per_trial", "Samples per trial of a candidate value; the trial's score is their median.");

  py::class_<TunedParameters>(m, "EngineParameters", "The engine's parameters in force, tuned ones included.")
      .def_readonly("fusion_threshold_bytes", &TunedParameters::fusion_threshold_bytes)
      .def_property_readonly("cycle_time_ms", [](const TunedParameters& p) { return p.cycle_time.count() / 1000.0; })
      .def_readonly("cache_enabled", &TunedParameters::cache_enabled)
      .def_readonly("hierarchical_allreduce", &TunedParameters::hierarchical_allreduce);

  py::class_<Engine>(m, "Engine", "The background thread that negotiates, fuses and runs collectives.")
      .def(py::init([](std::shared_ptr<Transport> transport, const EngineOptions& options) {
             if (!options.hosts.empty() && options.hosts.size() != static_cast<std::size_t>(transport->size())) {
               throw std::invalid_argument("hosts must give the host of every rank: got " +
                                           std::to_string(options.hosts.size()) + " entries for " +
                                           std::to_string(transport->size()) + " ranks.");
             }
             return std::make_unique<Engine>(std::move(transport), options);
           }),
           "transport"_a, "options"_a = EngineOptions())
      .def_property_readonly("parameters", &Engine::parameters,
                             "The parameters in force (the autotuner's current trial while it tunes).")
      .def_property_readonly("rank", &Engine::rank)
      .def_property_readonly("hierarchical_allreduce", &Engine::hierarchical_allreduce,
                             "Whether allreduce over the whole job runs within hosts, then across them.")
      .def_property_readonly("size", &Engine::size)
      .def(
          "submit",
          [](Engine& engine, const std::vector<const PythonRequest*>& requests, const std::string& group) {
            ParkedViews::instance().release();
            std::vector<Submission> submissions = make_submissions(requests, group);
            py::gil_scoped_release release;
            return engine.submit(std::move(submissions));
          },
          "requests"_a, "group"_a = "",
          "Queues requests and returns their handles at once. With a group name they form one group, queued\n"
          "whole or not at all and executed as one unit. ValueError for a name in flight or bad arguments.")
      .def(
          "run",
          [](Engine& engine, const PythonRequest& request) {
            return run_without_gil(engine, make_submission(request, "", 0));
          },
          "request"_a,
          "Submits one request and waits for it, driving the engine on this thread: submit() then wait() in one call.")
      .def(
          "run_all",
          [](Engine& engine, const std::vector<const PythonRequest*>& requests, const std::string& group) {
            ParkedViews::instance().release();
            return run_without_gil(engine, make_submissions(requests, group));
          },
          "requests"_a, "group"_a = "",
          "run() for several requests (with a group name, one group): submits them and waits for them all, driving\n"
          "the engine on this thread; their results in order, or the first failure once all have completed.")
      .def("try_run_in_place", &try_run_in_place, "kind"_a, "name"_a, "buffer"_a, "op"_a, "prescale"_a,
           "postscale"_a, "root"_a, "process_set"_a,
           "run() for an in-place allreduce or broadcast of one buffer, from its arguments: True once it ran;\n"
           "False, having done nothing, when the buffer is not a writable C-contiguous buffer whose format\n"
           "names a type Hora reduces (the request layer's checked path then says what is wrong).")
      .def("try_submit_in_place", &try_submit_in_place, "kind"_a, "name"_a, "buffer"_a, "op"_a, "prescale"_a,
           "postscale"_a, "root"_a, "process_set"_a,
           "submit() for an in-place allreduce or broadcast of one buffer, from its arguments: its handle; -1,\n"
           "having done nothing, where try_run_in_place declines.")
      .def_property_readonly("open_handles", &Engine::open_handles,
                             "How many handles the engine holds: requests in flight, and completed ones not yet\n"
                             "waited for or released.")
      .def_property_readonly("agreed_from_cache", &Engine::agreed_from_cache,
                             "How many tensors' responses were agreed from the response cache without the request\n"
                             "table (every member announced the cached tensor in one cycle): a statistic.")
      .def(
          "poll",
          [](Engine& engine, int64_t handle) {
            ParkedViews::instance().release();  // a caller that only polls still frees dropped buffers
            return engine.poll(handle);
          },
          "handle"_a)
      .def("wait", &wait_for, "handles"_a,
           "Blocks until every handle completes; returns their results in order, or raises the first failure\n"
           "(all are released either way). A KeyboardInterrupt leaves them all in flight.")
      .def("release", &Engine::release, "handle"_a,
           "Gives up a handle without waiting: the request completes with its buffers and its result is dropped.")
      .def(
          "shutdown",
          [](Engine& engine) {
            ReleaseParkedViews on_return;
            py::gil_scoped_release release;
            engine.shutdown();
          })
      .def(
          "start_timeline",
          [](Engine& engine, const std::string& path, bool mark_cycles) { engine.timeline().start(path, mark_cycles); },
          "path"_a, "mark_cycles"_a = false)
      .def("stop_timeline", [](Engine& engine) { engine.timeline().stop(); })
      .def("process_set", &Engine::process_set, "id"_a)
      .def("process_set_ids", &Engine::process_set_ids);

  m.def(
      "background_patience",
      [](double cycle_time_ms, double caller_away_ms, bool spare_cores) {
        using Millis = std::chrono::duration<double, std::milli>;
        const auto cycle = std::chrono::duration_cast<std::chrono::microseconds>(Millis(cycle_time_ms));
        const auto away = std::chrono::duration_cast<std::chrono::steady_clock::duration>(Millis(caller_away_ms));
        return Millis(background_patience(cycle, away, spare_cores)).count();
      },
      "cycle_time_ms"_a, "caller_away_ms"_a, "spare_cores"_a,
      "How long, in milliseconds, the background thread stays parked once the last caller stopped driving\n"
      "(exposed for tests; see Engine::park).");
}

}  // namespace hora::bindings
