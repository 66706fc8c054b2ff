// safetensors (Hugging Face) reader and writer.
//
// Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// (offsets relative to the first byte after the header), then the tensors' row-major,
// little-endian bytes, contiguous, without gaps or overlaps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/atomic_io.h"
#include "core/dtype.h"
#include "core/error.h"

namespace zo::ckpt {

// The reference implementation's limit; real headers are at most a few MB.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;
// The header a file of at most `entries` tensors needs: 1 KiB each (a name, a dtype, a shape, two
// offsets) and 1 MiB of metadata. A reader that knows what it reads passes this to open(), so a
// hostile header (millions of one-element tensors) is refused before it is parsed: its JSON
// would take about 15 bytes of memory per byte of header.
inline std::uint64_t safetensors_header_limit(std::size_t entries) {
  return std::min<std::uint64_t>(kMaxSafetensorsHeaderBytes,
                                 std::uint64_t(entries) * 1024 + (std::uint64_t{1} << 20));
}

// "F32" / "F16" / "BF16" for the three DTypes.
std::string_view safetensors_dtype_name(DType t);
std::string shape_to_string(std::span<const std::uint64_t> shape);  // "[7, 13]"

struct TensorInfo {
  std::string name;
  std::string dtype_name;            // as stored: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;        // set for F32, F16 and BF16, the dtypes read_* convert
  std::vector<std::uint64_t> shape;  // row-major; {} is a scalar
  std::uint64_t numel = 0;
  std::uint64_t data_begin = 0;  // byte range in the data section, as in the header
  std::uint64_t data_end = 0;
  std::uint64_t nbytes() const { return data_end - data_begin; }
};

// A validated, open safetensors file. open() checks the whole header against the file before
// anything is read, so a bad file fails fast with a message naming the file, the tensor and the
// problem. Tensor data is read on demand with pread (no mapping, no whole-file buffer); the const
// read functions may be called from several threads at once.
class SafetensorsFile {
 public:
  // Throws CheckpointError: missing/unreadable file, file too small, absurd header length, bad
  // JSON, an entry that is not an object, an unknown dtype, shape/byte-count mismatch,
  // out-of-bounds, overlapping or non-contiguous offsets, bytes not covered by any tensor.
  // Tensors of known but unconvertible dtypes (F64, I64, U8, ...) are accepted and listed; reading
  // them throws.
  // `max_header`: the largest header accepted (safetensors_header_limit).
  static SafetensorsFile open(const std::filesystem::path& path,
                              std::uint64_t max_header = kMaxSafetensorsHeaderBytes);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  std::uint64_t file_size() const { return file_size_; }
  std::uint64_t header_size() const { return data_start_ - 8; }  // N, including padding

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  // Throws CheckpointError naming the missing tensor (and a few that exist).
  const TensorInfo& info(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Throws CheckpointError "tensor X in F has shape [a, b], expected [c, d]" on mismatch.
  void expect_shape(std::string_view name, std::span<const std::uint64_t> dims) const;
  void expect_shape(std::string_view name, std::initializer_list<std::uint64_t> dims) const {
    expect_shape(name, std::span<const std::uint64_t>(dims.begin(), dims.size()));
  }

  // Reads the tensor converted to fp32 (exact: F16 and BF16 widen without rounding).
  // out.size() must equal the tensor's element count.
  void read_f32(std::string_view name, std::span<float> out) const;
  // Reads the tensor as 16-bit words of dtype `as` (kF16 or kBF16): stored bits copied as they are
  // when the dtypes match, else converted through fp32 with round-to-nearest-even.
  void read_u16(std::string_view name, std::span<std::uint16_t> out, DType as) const;
  // The same for elements [first, first + out.size()) of the tensor (in file order), so that a
  // large tensor is read through a bounded buffer.
  void read_f32(std::string_view name, std::span<float> out, std::uint64_t first) const;
  void read_u16(std::string_view name, std::span<std::uint16_t> out, DType as,
                std::uint64_t first) const;
  // Elements [first, first + out.size()) of a U8 tensor, as stored (8-bit optimizer codes).
  void read_u8(std::string_view name, std::span<std::uint8_t> out, std::uint64_t first) const;

 private:
  SafetensorsFile() = default;
  // `whole`: n must be the tensor's element count; else [first, first + n) must lie within it.
  void read_converted(const TensorInfo& t, DType out_dtype, void* out, std::size_t n,
                      std::uint64_t first, bool whole) const;
  const TensorInfo& info_u16(std::string_view name, DType as) const;  // refuses as == kF32
  void pread_all(void* dst, std::size_t n, std::uint64_t offset, const TensorInfo& t) const;

  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t file_size_ = 0;
  std::uint64_t data_start_ = 0;  // 8 + N
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and writes them as one safetensors file. Output is deterministic: metadata
// first, then tensors sorted by name, data in that order; the JSON header is padded with spaces
// to a multiple of 8 bytes so every tensor starts 8-byte aligned.
//
// The writer keeps the spans and fills it is given (no copy): the data must stay alive and
// unchanged until write()/stream() returns.
class SafetensorsWriter {
 public:
  // Writes elements [first, first + n) of a tensor, in file order, as `out`'s n stored values of
  // the tensor's dtype (n = out.size() / dtype size).
  using Fill = std::function<void(std::uint64_t first, std::span<std::byte> out)>;
  // Elements per call of a Fill: the one buffer stream() fills and writes, 256 KiB of fp32.
  static constexpr std::size_t kFillElements = std::size_t{1} << 16;
  // Stores fp32 data as `dtype` (F32, or F16/BF16 rounded to nearest even). Throws
  // CheckpointError on an empty, reserved or duplicate name, or data.size() != product(shape).
  void add(std::string name, std::vector<std::uint64_t> shape, std::span<const float> data,
           DType dtype = DType::kF32);
  // Stores 16-bit words that already are `dtype` (kF16 or kBF16), bit for bit.
  void add_u16(std::string name, std::vector<std::uint64_t> shape,
               std::span<const std::uint16_t> data, DType dtype);
  // A tensor whose data `fill` produces while the file is streamed, at most kFillElements at a
  // time: no copy of the whole tensor is ever held. An exception from fill aborts the write.
  void add_filled(std::string name, std::vector<std::uint64_t> shape, DType dtype, Fill fill);
  // The same for a U8 tensor (8-bit optimizer codes), its bytes filled as they are stored.
  void add_filled_u8(std::string name, std::vector<std::uint64_t> shape, Fill fill);
  // String metadata ("__metadata__"). "format" defaults to "pt", as Hugging Face transformers
  // requires to load the file.
  void set_metadata(std::string key, std::string value);

  std::size_t size() const { return entries_.size(); }
  std::string header() const;       // the padded JSON header (N bytes)
  std::uint64_t file_size() const;  // 8 + N + data bytes
  // Emits the whole file (length, header, data) to `sink`, for AtomicDirectory::write_file.
  void stream(const ByteSink& sink) const;
  // write_file_atomic(path, ...): the old file survives any failure.
  void write(const std::filesystem::path& path) const;

 private:
  struct Entry {
    std::vector<std::uint64_t> shape;
    std::uint64_t numel = 0;
    DType dtype = DType::kF32;           // as stored
    const float* f32 = nullptr;          // source when added with add()
    const std::uint16_t* u16 = nullptr;  // source when added with add_u16()
    Fill fill;                           // source when added with add_filled()
    bool u8 = false;                     // stored as U8 (add_filled_u8), not as dtype
  };
  void check_new_name(const std::string& name) const;

  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace zo::ckpt
