// Byte counts as people write them.
#pragma once

#include <cstddef>
#include <string>

namespace zo {

// "1.50 GiB", "512 B": binary units, two decimals above bytes.
std::string format_bytes(std::size_t bytes);
// "1.61 GB": decimal units, as disks and cloud instances are sold (parse_bytes reads both).
std::string format_bytes_si(std::size_t bytes);

// "512MiB", "2GiB", "1.5GB", "4096" (bytes); binary (KiB..TiB) and decimal (KB..TB) units.
// Throws std::invalid_argument naming the text and the accepted forms.
std::size_t parse_bytes(const std::string& text);

}  // namespace zo
