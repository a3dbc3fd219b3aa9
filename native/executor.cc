#include "executor.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "collectives.h"
#include "reduce.h"
#include "segments.h"

namespace hora {

struct Executor::Context {
  const Response& response;
  const std::vector<const Submission*>& local;
  Transport& transport;  // the response's process set
  std::vector<Result>& results;
  std::size_t element_bytes;

  int64_t elements(std::size_t tensor, std::size_t from = 0) const {
    const std::vector<int64_t>& shape = response.tensors[tensor].shape;
    int64_t count = 1;
    for (std::size_t i = from; i < shape.size(); ++i) count *= shape[i];
    return count;
  }
  int64_t rows(std::size_t tensor) const {
    const std::vector<int64_t>& shape = response.tensors[tensor].shape;
    return shape.empty() ? 1 : shape[0];
  }
  bool fused() const { return response.tensors.size() > 1; }
};

void Executor::use_hierarchy(std::vector<int> host, std::vector<int> cross) {
  host_ = std::make_unique<SubsetTransport>(transport_, std::move(host));
  cross_ = std::make_unique<SubsetTransport>(transport_, std::move(cross));
}

char* Executor::fusion_buffer(std::size_t bytes) {
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

char* Executor::widen(const char* data, DataType from, DataType to, std::size_t count) {
  const std::size_t bytes = count * element_size(to);
  if (widened_.size() < bytes) widened_.resize(bytes);
  convert(data, from, widened_.data(), to, count);
  return widened_.data();
}

void Executor::span_begin(const Context& context, const char* activity) {
  if (!timeline_.active()) return;
  const auto now = std::chrono::steady_clock::now();
  for (const TensorEntry& tensor : context.response.tensors) timeline_.begin(tensor.name, activity, now);
}

void Executor::span_end(const Context& context) {
  if (!timeline_.active()) return;
  const auto now = std::chrono::steady_clock::now();
  for (const TensorEntry& tensor : context.response.tensors) timeline_.end(tensor.name, now);
}

void Executor::execute(const Response& response, const std::vector<const Submission*>& local,
                       const std::vector<int>& members, std::vector<Result>& results) {
  std::unique_ptr<SubsetTransport> subset;
  Transport* transport = &transport_;
  if (static_cast<int>(members.size()) != transport_.size()) {
    subset = std::make_unique<SubsetTransport>(transport_, members);
    transport = subset.get();
  }
  // Ranks that joined contribute the identity of the op, and an Average
  // still divides by the size of the set, as in Horovod.
  results.assign(response.tensors.size(), Result{});
  Context context{response, local, *transport, results, element_size(response.dtype)};
  switch (response.kind) {
    case RequestKind::kAllreduce: allreduce(context); break;
    case RequestKind::kAllgather: allgather(context); break;
    case RequestKind::kBroadcast: broadcast(context); break;
    case RequestKind::kAlltoall: alltoall(context); break;
    case RequestKind::kReducescatter: reducescatter(context); break;
    default: break;  // barrier: agreeing on it was the whole operation
  }
}

void Executor::allreduce(Context& context) {
  const Response& response = context.response;
  const std::size_t count = response.tensors.size();
  std::vector<std::size_t>& offsets = offsets_;
  offsets.assign(count + 1, 0);
  for (std::size_t i = 0; i < count; ++i) offsets[i + 1] = offsets[i] + context.elements(i);
  const std::size_t total = offsets[count];

  char* data;
  const char* input = nullptr;  // where this rank's contribution is read from, when not `data`
  if (!context.fused() && context.local[0] != nullptr) {
    data = static_cast<char*>(context.local[0]->buffer);  // in place (or out of place from `input`), no copy
    input = static_cast<const char*>(context.local[0]->input);
  } else {
    data = fusion_buffer(total * context.element_bytes);
    span_begin(context, "MEMCPY_IN_FUSION_BUFFER");
    for (std::size_t i = 0; i < count; ++i) {
      char* at = data + offsets[i] * context.element_bytes;
      const std::size_t bytes = (offsets[i + 1] - offsets[i]) * context.element_bytes;
      if (context.local[i] != nullptr) {
        const void* from = context.local[i]->input ? context.local[i]->input : context.local[i]->buffer;
        if (bytes) std::memcpy(at, from, bytes);
      } else {
        fill_identity(at, offsets[i + 1] - offsets[i], response.dtype, response.op);
      }
    }
    span_end(context);
  }
  span_begin(context, "ALLREDUCE");
  const DataType dtype = accumulation_type(response.dtype, response.op);
  char* reduced = dtype == response.dtype ? data : widen(input ? input : data, response.dtype, dtype, total);
  if (reduced != data) input = nullptr;  // the widened copy is the input now
  if (host_ != nullptr && hierarchy_enabled_ && &context.transport == &transport_) {
    if (input != nullptr && input != reduced && total) std::memcpy(reduced, input, total * context.element_bytes);
    hierarchical_allreduce(*host_, *cross_, reduced, total, dtype, response.op, response.prescale,
                           response.postscale);
  } else {
    hora::allreduce(context.transport, input ? input : reduced, reduced, total, dtype, response.op, response.prescale,
                    response.postscale);
  }
  if (reduced != data) convert(reduced, dtype, data, response.dtype, total);
  span_end(context);
  if (data == static_cast<char*>(context.local[0] ? context.local[0]->buffer : nullptr)) return;
  span_begin(context, "MEMCPY_OUT_FUSION_BUFFER");
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t bytes = (offsets[i + 1] - offsets[i]) * context.element_bytes;
    if (context.local[i] != nullptr && bytes) {
      std::memcpy(context.local[i]->buffer, data + offsets[i] * context.element_bytes, bytes);
    }
  }
  span_end(context);
}

// Fused allgather: the buffer holds one block per member, and member r's
// block is the concatenation of its rows of every tensor, in order. After
// the gather, tensor i's output is its piece of block 0, then of block 1, ...
void Executor::allgather(Context& context) {
  const Response& response = context.response;
  const std::size_t count = response.tensors.size();
  const int size = context.transport.size();
  const int me = context.transport.rank();
  std::vector<std::size_t> row_bytes(count);
  for (std::size_t i = 0; i < count; ++i) row_bytes[i] = context.elements(i, 1) * context.element_bytes;
  std::vector<std::size_t> block_bytes(size, 0);
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < count; ++i) block_bytes[r] += response.tensors[i].first_dims[r] * row_bytes[i];
  }
  auto allocate = [&](std::size_t i) {
    int64_t rows = 0;
    for (int64_t dim : response.tensors[i].first_dims) rows += dim;
    Result& result = context.results[i];
    result.output = std::make_shared<std::vector<char>>(rows * row_bytes[i]);
    result.shape = response.tensors[i].shape;
    result.shape[0] = rows;
  };

  if (!context.fused()) {
    allocate(0);
    const void* input = context.local[0] ? context.local[0]->buffer : nullptr;
    span_begin(context, "ALLGATHER");
    hora::allgather(context.transport, input, context.results[0].output->data(), block_bytes);
    span_end(context);
    return;
  }
  std::vector<std::size_t> block_offsets(size + 1, 0);
  for (int r = 0; r < size; ++r) block_offsets[r + 1] = block_offsets[r] + block_bytes[r];
  char* data = fusion_buffer(block_offsets[size]);
  span_begin(context, "MEMCPY_IN_FUSION_BUFFER");
  char* mine = data + block_offsets[me];
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t bytes = response.tensors[i].first_dims[me] * row_bytes[i];
    if (context.local[i] != nullptr && bytes) std::memcpy(mine, context.local[i]->buffer, bytes);
    mine += bytes;
  }
  span_end(context);
  span_begin(context, "ALLGATHER");
  hora::allgather(context.transport, data + block_offsets[me], data, block_bytes);
  span_end(context);
  span_begin(context, "MEMCPY_OUT_FUSION_BUFFER");
  std::vector<char*> outputs(count);
  for (std::size_t i = 0; i < count; ++i) {
    allocate(i);
    outputs[i] = context.results[i].output->data();
  }
  for (int r = 0; r < size; ++r) {
    const char* from = data + block_offsets[r];
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t bytes = response.tensors[i].first_dims[r] * row_bytes[i];
      if (bytes) std::memcpy(outputs[i], from, bytes);
      outputs[i] += bytes;
      from += bytes;
    }
  }
  span_end(context);
}

void Executor::broadcast(Context& context) {
  const Response& response = context.response;
  const std::size_t bytes = context.elements(0) * context.element_bytes;
  const std::vector<int>* members = nullptr;
  int root = response.root;
  if (auto* subset = dynamic_cast<SubsetTransport*>(&context.transport)) {
    members = &subset->members();
    root = static_cast<int>(std::find(members->begin(), members->end(), response.root) - members->begin());
  }
  void* data = context.local[0] ? context.local[0]->buffer : fusion_buffer(bytes);
  span_begin(context, "BROADCAST");
  hora::broadcast(context.transport, data, bytes, root);
  span_end(context);
}

void Executor::alltoall(Context& context) {
  const Response& response = context.response;
  const int size = context.transport.size();
  const std::size_t row_bytes = context.elements(0, 1) * context.element_bytes;
  std::vector<int64_t> send_rows(size, 0);
  if (context.local[0] != nullptr) send_rows = context.local[0]->splits;
  std::vector<int64_t> recv_rows(size, 0);
  span_begin(context, "ALLTOALL");
  const std::vector<std::size_t> counts(size, sizeof(int64_t));
  hora::alltoall(context.transport, send_rows.data(), counts, recv_rows.data(), counts);
  std::vector<std::size_t> send_bytes(size), recv_bytes(size);
  int64_t total_rows = 0;
  for (int r = 0; r < size; ++r) {
    send_bytes[r] = send_rows[r] * row_bytes;
    recv_bytes[r] = recv_rows[r] * row_bytes;
    total_rows += recv_rows[r];
  }
  Result& result = context.results[0];
  result.output = std::make_shared<std::vector<char>>(total_rows * row_bytes);
  result.shape = response.tensors[0].shape;
  if (result.shape.empty()) result.shape.push_back(0);
  result.shape[0] = total_rows;
  result.received_splits = recv_rows;
  const void* input = context.local[0] ? context.local[0]->buffer : nullptr;
  hora::alltoall(context.transport, input, send_bytes, result.output->data(), recv_bytes);
  span_end(context);
}

// Fused reducescatter: every tensor is split by rows over the members (the
// first rows % size members get one row more); block r of the buffer holds
// member r's rows of every tensor, so one reduce-scatter leaves each member
// its rows of all of them.
void Executor::reducescatter(Context& context) {
  const Response& response = context.response;
  const std::size_t count = response.tensors.size();
  const int size = context.transport.size();
  const int me = context.transport.rank();
  std::vector<std::vector<int64_t>> rows(count);
  std::vector<std::size_t> row_elements(count);
  std::vector<std::size_t> block_counts(size, 0);
  for (std::size_t i = 0; i < count; ++i) {
    rows[i] = even_split<int64_t>(context.rows(i), size);
    row_elements[i] = context.elements(i, 1);
    for (int r = 0; r < size; ++r) block_counts[r] += rows[i][r] * row_elements[i];
  }
  std::size_t total = 0;
  for (std::size_t c : block_counts) total += c;
  const std::size_t eb = context.element_bytes;
  char* data = fusion_buffer(total * eb);

  span_begin(context, "MEMCPY_IN_FUSION_BUFFER");
  char* at = data;
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t n = rows[i][r] * row_elements[i];
      if (context.local[i] != nullptr) {
        int64_t first_row = 0;
        for (int s = 0; s < r; ++s) first_row += rows[i][s];
        if (n) std::memcpy(at, static_cast<const char*>(context.local[i]->buffer) + first_row * row_elements[i] * eb, n * eb);
      } else {
        fill_identity(at, n, response.dtype, response.op);
      }
      at += n * eb;
    }
  }
  span_end(context);
  span_begin(context, "REDUCESCATTER");
  std::vector<std::size_t> counts(block_counts.begin(), block_counts.end());
  std::size_t mine = 0;
  for (int r = 0; r < me; ++r) mine += block_counts[r];
  const DataType dtype = accumulation_type(response.dtype, response.op);
  char* reduced = dtype == response.dtype ? data : widen(data, response.dtype, dtype, total);
  hora::reducescatter(context.transport, reduced, counts, dtype, response.op, response.prescale, response.postscale);
  if (reduced != data) {
    const std::size_t wide_bytes = element_size(dtype);
    convert(reduced + mine * wide_bytes, dtype, data + mine * eb, response.dtype, block_counts[me]);
  }
  span_end(context);
  span_begin(context, "MEMCPY_OUT_FUSION_BUFFER");
  const char* from = data + mine * eb;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t n = rows[i][me] * row_elements[i];
    Result& result = context.results[i];
    result.output = std::make_shared<std::vector<char>>(from, from + n * eb);
    result.shape = response.tensors[i].shape;
    result.shape[0] = rows[i][me];
    from += n * eb;
  }
  span_end(context);
}

}  // namespace hora
