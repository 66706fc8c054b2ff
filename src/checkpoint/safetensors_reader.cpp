// SafetensorsFile after open(): ownership of the descriptor, tensor lookup and shape checks, and
// reading tensor data with pread, converted between F32, F16 and BF16 on the way.
#include "checkpoint/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "checkpoint/atomic_io_internal.h"
#include "checkpoint/safetensors_internal.h"

namespace zo::ckpt {

namespace {

float load_as_f32(DType t, const std::byte* p, std::size_t i) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case DType::kF16:
    case DType::kBF16: {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return t == DType::kF16 ? half_to_float(h) : bf16_to_float(h);
    }
  }
  return 0.0f;
}

void store_from_f32(DType t, void* out, std::size_t i, float f) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(out)[i] = f;
      return;
    case DType::kF16:
      static_cast<std::uint16_t*>(out)[i] = float_to_half(f);
      return;
    case DType::kBF16:
      static_cast<std::uint16_t*>(out)[i] = float_to_bf16(f);
      return;
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      file_size_(other.file_size_),
      data_start_(other.data_start_),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    file_size_ = other.file_size_;
    data_start_ = other.data_start_;
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_)
    out.push_back(t.name);
  return out;
}

bool SafetensorsFile::contains(std::string_view name) const {
  const auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const TensorInfo& t, std::string_view n) { return std::string_view(t.name) < n; });
  return it != tensors_.end() && it->name == name;
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  const auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const TensorInfo& t, std::string_view n) { return std::string_view(t.name) < n; });
  if (it != tensors_.end() && it->name == name) return *it;
  std::string msg = "no tensor named '" + std::string(name) + "' (the file has " +
                    std::to_string(tensors_.size()) + " tensors";
  for (std::size_t i = 0; i < tensors_.size() && i < 5; ++i) {
    msg += (i ? ", '" : ": '") + tensors_[i].name + "'";
  }
  if (tensors_.size() > 5) msg += ", ...";
  fail(path_, msg + "). Is it a checkpoint of this model (Hugging Face GPT-2 names)?");
}

void SafetensorsFile::expect_shape(std::string_view name,
                                   std::span<const std::uint64_t> dims) const {
  const TensorInfo& t = info(name);
  if (!std::equal(t.shape.begin(), t.shape.end(), dims.begin(), dims.end())) {
    fail_tensor(path_, t.name,
                "has shape " + shape_to_string(t.shape) + ", expected " + shape_to_string(dims) +
                    ". The checkpoint does not match the model spec (n_layer, n_embd, "
                    "vocab_size, n_positions).");
  }
}

void SafetensorsFile::read_f32(std::string_view name, std::span<float> out) const {
  read_converted(info(name), DType::kF32, out.data(), out.size(), 0, true);
}

void SafetensorsFile::read_u16(std::string_view name, std::span<std::uint16_t> out,
                               DType as) const {
  read_converted(info_u16(name, as), as, out.data(), out.size(), 0, true);
}

void SafetensorsFile::read_f32(std::string_view name, std::span<float> out,
                               std::uint64_t first) const {
  read_converted(info(name), DType::kF32, out.data(), out.size(), first, false);
}

void SafetensorsFile::read_u16(std::string_view name, std::span<std::uint16_t> out, DType as,
                               std::uint64_t first) const {
  read_converted(info_u16(name, as), as, out.data(), out.size(), first, false);
}

void SafetensorsFile::read_u8(std::string_view name, std::span<std::uint8_t> out,
                              std::uint64_t first) const {
  const TensorInfo& t = info(name);
  if (t.dtype_name != "U8") {
    fail_tensor(path_, t.name, "is " + t.dtype_name + ", expected U8 (8-bit optimizer codes).");
  }
  if (first > t.numel || out.size() > t.numel - first) {
    fail_tensor(path_, t.name,
                "destination holds " + std::to_string(out.size()) + " elements from element " +
                    std::to_string(first) + ", the tensor has " + std::to_string(t.numel) + ".");
  }
  pread_all(out.data(), out.size(), data_start_ + t.data_begin + first, t);
}

const TensorInfo& SafetensorsFile::info_u16(std::string_view name, DType as) const {
  const TensorInfo& t = info(name);
  if (as == DType::kF32) {
    fail_tensor(path_, t.name, "read_u16 needs a 16-bit target dtype (F16 or BF16), not F32.");
  }
  return t;
}

void SafetensorsFile::pread_all(void* dst, std::size_t n, std::uint64_t offset,
                                const TensorInfo& t) const {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got =
        ::pread(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(path_, "read failed" + (t.name.empty() ? "" : " for tensor '" + t.name + "'") + ": " +
                      errno_text(errno) + ".");
    }
    if (got == 0) {
      fail(path_, "unexpected end of file at byte " + std::to_string(offset) +
                      (t.name.empty() ? "" : " reading tensor '" + t.name + "'") +
                      ": the file was truncated after it was opened.");
    }
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
}

void SafetensorsFile::read_converted(const TensorInfo& t, DType out_dtype, void* out, std::size_t n,
                                     std::uint64_t first, bool whole) const {
  if (!t.dtype) {
    fail_tensor(path_, t.name,
                "dtype " + t.dtype_name +
                    " is not supported (supported: F32, F16, BF16). Convert the checkpoint to "
                    "one of those, or leave this tensor out.");
  }
  if (whole ? n != t.numel : first > t.numel || n > t.numel - first) {
    fail_tensor(path_, t.name,
                "destination holds " + std::to_string(n) + " elements" +
                    (whole ? "" : " from element " + std::to_string(first)) + ", the tensor has " +
                    std::to_string(t.numel) + " (shape " + shape_to_string(t.shape) + ").");
  }
  const DType in = *t.dtype;
  const std::size_t in_size = dtype_size(in);
  const std::uint64_t base = data_start_ + t.data_begin + first * in_size;
  if (in == out_dtype) {  // same bits: straight into the destination
    pread_all(out, n * in_size, base, t);
    return;
  }
  std::vector<std::byte> buf(std::min<std::size_t>(n, kChunkElems) * in_size);
  for (std::size_t done = 0; done < n;) {
    const std::size_t k = std::min(n - done, kChunkElems);
    pread_all(buf.data(), k * in_size, base + done * in_size, t);
    for (std::size_t i = 0; i < k; ++i) {
      store_from_f32(out_dtype, out, done + i, load_as_f32(in, buf.data(), i));
    }
    done += k;
  }
}

}  // namespace zo::ckpt
