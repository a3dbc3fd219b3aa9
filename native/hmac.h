// HMAC-SHA256 (RFC 2104 over FIPS 180-4), used to authenticate peer
// connections with the job secret. Self-contained so that the core builds
// with nothing but a C++17 compiler.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hora {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, std::size_t size);
Digest hmac_sha256(const std::string& key, const void* data, std::size_t size);

// Compares two digests in time independent of where they differ.
bool digests_equal(const Digest& a, const Digest& b);

// Fills `out` with bytes from the system's random source (std::random_device),
// for handshake challenges and segment tokens.
void random_bytes(uint8_t* out, std::size_t size);

template <std::size_t N>
std::array<uint8_t, N> random_array() {
  std::array<uint8_t, N> bytes;
  random_bytes(bytes.data(), N);
  return bytes;
}

}  // namespace hora
