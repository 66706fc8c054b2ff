// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of checkpoint manifests and
// of the optimizer-state files. Same parameters as iSCSI (RFC 3720), ext4 and Google's crc32c:
// CRC-32C("123456789") = 0xE3069283. Uses the SSE4.2 crc32 instruction when the CPU has it (chosen
// at run time), else a slicing-by-8 table; both give identical results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace zo {

// Incremental: crc32c(b, crc32c(a)) == crc32c(a ++ b). Start from 0.
std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc = 0);
inline std::uint32_t crc32c(std::string_view s, std::uint32_t crc = 0) {
  return crc32c(std::as_bytes(std::span(s.data(), s.size())), crc);
}

namespace detail {
// The two implementations, exposed so tests can compare them on the same input.
std::uint32_t crc32c_table(std::span<const std::byte> data, std::uint32_t crc);
bool crc32c_hw_available();
std::uint32_t crc32c_hw(std::span<const std::byte> data, std::uint32_t crc);  // needs SSE4.2
}  // namespace detail

}  // namespace zo
