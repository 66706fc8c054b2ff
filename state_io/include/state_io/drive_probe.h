// A drive's sequential rates as the optimizer state sees them: a file of the given size in DIR
// written and then read through the same StateFile and IoQueue the pager uses (O_DIRECT, 16 MiB
// transfers, 8 in flight). For `info --state-dir`, the plan's prediction and bench_state_dir.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace zo::state_io {

struct DriveRates {
  double read_gbps = 0.0, write_gbps = 0.0;  // 1e9 bytes per second
  std::string queue;                         // "io_uring", or "threads (why)"
  std::string io;                            // "O_DIRECT", or why buffered
  // Seconds to read and then write `bytes` at these rates.
  double read_write_seconds(double bytes) const {
    return bytes / (read_gbps * 1e9) + bytes / (write_gbps * 1e9);
  }
};

// Throws IoError as StateFile::create does (a missing directory, a full drive). The file is
// unnamed and gone when the probe returns.
DriveRates measure_drive(const std::filesystem::path& dir, std::uint64_t bytes);

}  // namespace zo::state_io
