#include "request.h"

namespace hora {

std::string to_string(RequestKind kind) {
  switch (kind) {
    case RequestKind::kAllreduce: return "allreduce";
    case RequestKind::kAllgather: return "allgather";
    case RequestKind::kBroadcast: return "broadcast";
    case RequestKind::kAlltoall: return "alltoall";
    case RequestKind::kReducescatter: return "reducescatter";
    case RequestKind::kBarrier: return "barrier";
    case RequestKind::kJoin: return "join";
    case RequestKind::kAddProcessSet: return "add_process_set";
    case RequestKind::kRemoveProcessSet: return "remove_process_set";
    case RequestKind::kShutdown: return "shutdown";
  }
  return "unknown";
}

void write_request(Writer& out, const Request& request) {
  out.put_string(request.name);
  out.put<RequestKind>(request.kind);
  out.put<int32_t>(request.process_set);
  out.put<DataType>(request.dtype);
  out.put<ReduceOp>(request.op);
  out.put<double>(request.prescale);
  out.put<double>(request.postscale);
  out.put<int32_t>(request.root);
  out.put_vector(request.shape);
  out.put_string(request.group);
  out.put<int32_t>(request.group_size);
  out.put_vector(request.ranks);
}

Request read_request(Reader& in) {
  Request request;
  request.name = in.get_string();
  request.kind = in.get<RequestKind>();
  request.process_set = in.get<int32_t>();
  request.dtype = in.get<DataType>();
  request.op = in.get<ReduceOp>();
  request.prescale = in.get<double>();
  request.postscale = in.get<double>();
  request.root = in.get<int32_t>();
  request.shape = in.get_vector<int64_t>();
  request.group = in.get_string();
  request.group_size = in.get<int32_t>();
  request.ranks = in.get_vector<int32_t>();
  return request;
}

bool same_parameters(const Response& a, const Response& b) {
  return a.kind == b.kind && a.process_set == b.process_set && a.dtype == b.dtype && a.op == b.op &&
         a.prescale == b.prescale && a.postscale == b.postscale && a.root == b.root && a.error == b.error &&
         a.joined == b.joined && a.last_joined == b.last_joined && a.ranks == b.ranks;
}

void write_parameters(Writer& out, const Response& response) {
  out.put<RequestKind>(response.kind);
  out.put<int32_t>(response.process_set);
  out.put<DataType>(response.dtype);
  out.put<ReduceOp>(response.op);
  out.put<double>(response.prescale);
  out.put<double>(response.postscale);
  out.put<int32_t>(response.root);
  out.put_string(response.error);
  out.put_vector(response.joined);
  out.put<int32_t>(response.last_joined);
  out.put_vector(response.ranks);
}

Response read_parameters(Reader& in) {
  Response response;
  response.kind = in.get<RequestKind>();
  response.process_set = in.get<int32_t>();
  response.dtype = in.get<DataType>();
  response.op = in.get<ReduceOp>();
  response.prescale = in.get<double>();
  response.postscale = in.get<double>();
  response.root = in.get<int32_t>();
  response.error = in.get_string();
  response.joined = in.get_vector<int32_t>();
  response.last_joined = in.get<int32_t>();
  response.ranks = in.get_vector<int32_t>();
  return response;
}

void write_tensor(Writer& out, const TensorEntry& tensor) {
  out.put_string(tensor.name);
  out.put_vector(tensor.shape);
  out.put_vector(tensor.first_dims);
}

TensorEntry read_tensor(Reader& in) {
  TensorEntry tensor;
  tensor.name = in.get_string();
  tensor.shape = in.get_vector<int64_t>();
  tensor.first_dims = in.get_vector<int64_t>();
  return tensor;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace hora
