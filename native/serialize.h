// Byte encoding of the engine's control messages: little-endian fixed-size
// values, length-prefixed strings and vectors. Only the engine's own peers
// (authenticated at connection time) send these, but a malformed message
// still fails with HoraInternalError rather than reading out of bounds.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "errors.h"

namespace hora {

class Writer {
 public:
  explicit Writer(std::size_t capacity = 0) { data_.reserve(capacity); }
  // Writes into `storage` from its start, reusing its memory.
  explicit Writer(std::vector<char>&& storage) : data_(std::move(storage)) { data_.clear(); }

  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* bytes = reinterpret_cast<const char*>(&value);
    data_.insert(data_.end(), bytes, bytes + sizeof value);
  }
  void put_string(const std::string& text) {
    put<uint32_t>(static_cast<uint32_t>(text.size()));
    data_.insert(data_.end(), text.begin(), text.end());
  }
  template <typename T>
  void put_vector(const std::vector<T>& values) {
    put<uint32_t>(static_cast<uint32_t>(values.size()));
    for (const T& value : values) put<T>(value);
  }
  std::vector<char>& data() { return data_; }

 private:
  std::vector<char> data_;
};

class Reader {
 public:
  Reader(const char* data, std::size_t size) : data_(data), size_(size) {}

  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    std::memcpy(&value, take(sizeof value), sizeof value);
    return value;
  }
  std::string get_string() {
    const uint32_t length = get<uint32_t>();
    const char* bytes = take(length);
    return std::string(bytes, length);
  }
  template <typename T>
  std::vector<T> get_vector() {
    std::vector<T> values;
    get_vector(values);
    return values;
  }
  // The same into `values`, reusing its memory.
  template <typename T>
  void get_vector(std::vector<T>& values) {
    const uint32_t length = get<uint32_t>();
    if (length > (size_ - offset_) / sizeof(T)) {
      throw HoraInternalError("malformed engine message: vector longer than the message");
    }
    values.resize(length);
    for (T& value : values) value = get<T>();
  }
  bool done() const { return offset_ == size_; }

 private:
  const char* take(std::size_t bytes) {
    if (bytes > size_ - offset_) throw HoraInternalError("malformed engine message: truncated");
    const char* at = data_ + offset_;
    offset_ += bytes;
    return at;
  }

  const char* data_;
  std::size_t size_;
  std::size_t offset_ = 0;
};

}  // namespace hora
