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

std::size_t response_bytes(const Response& response) {
  std::size_t bytes = 0;
  for (const TensorEntry& tensor : response.tensors) {
    int64_t rows = tensor.shape.empty() ? 1 : tensor.shape[0];
    if (response.kind == RequestKind::kAllgather) {
      rows = 0;
      for (int64_t dim : tensor.first_dims) rows += dim;
    }
    int64_t row = 1;
    for (std::size_t i = 1; i < tensor.shape.size(); ++i) row *= tensor.shape[i];
    bytes += static_cast<std::size_t>(rows * row) * element_size(response.dtype);
  }
  return bytes;
}

bool answers(const Response& response, const Request& request) {
  return response.kind == request.kind && response.process_set == request.process_set &&
         response.dtype == request.dtype && response.op == request.op && response.prescale == request.prescale &&
         response.postscale == request.postscale && response.root == request.root && response.error.empty() &&
         response.joined.empty() && response.last_joined == -1 && response.ranks == request.ranks;
}

Response response_for(const Request& request) {
  Response response;
  response.kind = request.kind;
  response.process_set = request.process_set;
  response.dtype = request.dtype;
  response.op = request.op;
  response.prescale = request.prescale;
  response.postscale = request.postscale;
  response.root = request.root;
  response.ranks = request.ranks;
  return response;
}

Request request_for(const Response& response, const TensorEntry& tensor) {
  Request request;
  request.name = tensor.name;
  request.kind = response.kind;
  request.process_set = response.process_set;
  request.dtype = response.dtype;
  request.op = response.op;
  request.prescale = response.prescale;
  request.postscale = response.postscale;
  request.root = response.root;
  request.shape = tensor.shape;
  request.ranks = response.ranks;
  request.group = tensor.group;
  request.group_size = tensor.group_size;
  return request;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace hora
