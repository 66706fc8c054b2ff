// Byte counts as people write them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace zo {

// "1.50 GiB", "512 B": binary units, two decimals above bytes.
std::string format_bytes(std::size_t bytes);
// "1.61 GB": decimal units, as disks and cloud instances are sold (parse_bytes reads both).
std::string format_bytes_si(std::size_t bytes);

// "512MiB", "2GiB", "1.5GB", "4096" (bytes); binary (KiB..TiB) and decimal (KB..TB) units.
// The result is a whole number of bytes from 1 to 2^64 - 1 (0, which callers read as "not
// given" or "unlimited", is never returned):
//  - a count in bytes (no unit, or B) must be whole: "0.5B" and "1.5" are refused;
//  - with a larger unit a fraction is rounded to the nearest byte ("1.3KiB" = 1331 bytes), and a
//    value under one byte ("0.0001KiB") is refused;
//  - zero, negative and not-a-number values are refused, and so is a value of 2^64 bytes
//    (16 EiB, 16777216TiB) or more, which would not fit the result.
// Throws std::invalid_argument naming `what` (the flag, e.g. "--host-memory"; may be empty), the
// text, and the accepted forms or range.
std::size_t parse_bytes(const std::string& text, std::string_view what = {});

}  // namespace zo
