#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

namespace zo::ckpt {
namespace fs = std::filesystem;

// Tensor bytes are copied to and from memory as they are: the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace {

constexpr std::size_t kChunkElems = std::size_t{1} << 16;  // conversion buffer (elements)

struct DtypeSpec {
  std::string_view name;
  unsigned bits;
};
// Every dtype of the safetensors spec, so sizes of tensors we cannot convert are still checked.
constexpr DtypeSpec kDtypes[] = {
    {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32}, {"F32", 32}, {"F64", 64},    {"I64", 64},
    {"U64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
};

const DtypeSpec* find_dtype(std::string_view name) {
  for (const DtypeSpec& d : kDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::optional<DType> convertible_dtype(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
}

std::string prefix(const fs::path& p) {
  return "safetensors file '" + p.string() + "': ";
}

[[noreturn]] void fail(const fs::path& p, const std::string& what) {
  throw CheckpointError(prefix(p) + what);
}

[[noreturn]] void fail_tensor(const fs::path& p, const std::string& name, const std::string& what) {
  throw CheckpointError(prefix(p) + "tensor '" + name + "': " + what);
}

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// a * b, or nullopt on 64-bit overflow.
std::optional<std::uint64_t> mul_checked(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

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

std::string_view safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

std::string shape_to_string(std::span<const std::uint64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ---- reader -------------------------------------------------------------------------------------

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

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) {
    const int err = errno;
    fail(path, "cannot open: " + errno_text(err) +
                   (err == ENOENT ? ". Check the path (--init-from / --resume)." : "."));
  }
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) fail(path, "cannot stat: " + errno_text(errno) + ".");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file (a directory?).");
  f.file_size_ = static_cast<std::uint64_t>(st.st_size);
  if (f.file_size_ < 8) {
    fail(path, "file too small (" + std::to_string(f.file_size_) +
                   " bytes) to be safetensors: it must start with an 8-byte header length. The "
                   "file is truncated or not a safetensors file.");
  }

  // Header length, little-endian, assembled byte by byte.
  unsigned char len_bytes[8];
  TensorInfo none;
  f.pread_all(len_bytes, 8, 0, none);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxSafetensorsHeaderBytes) {
    fail(path, "header length " + std::to_string(header_len) + " bytes is absurd (limit " +
                   std::to_string(kMaxSafetensorsHeaderBytes) +
                   "): this is not a safetensors file, or it is corrupted.");
  }
  if (header_len > f.file_size_ - 8) {
    fail(path, "header length " + std::to_string(header_len) + " bytes exceeds the file (" +
                   std::to_string(f.file_size_) +
                   " bytes): the file is truncated or not "
                   "safetensors.");
  }
  f.data_start_ = 8 + header_len;
  const std::uint64_t data_size = f.file_size_ - f.data_start_;

  std::string header(static_cast<std::size_t>(header_len), '\0');
  f.pread_all(header.data(), header.size(), 8, none);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(header);
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, std::string("header is not valid JSON (") + e.what() +
                   "). The file is corrupted or not safetensors.");
  }
  if (!doc.is_object()) {
    fail(path, std::string("header must be a JSON object, found ") + doc.type_name() + ".");
  }

  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        fail(path, std::string("__metadata__ must be an object of strings, found ") +
                       entry.type_name() + ".");
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          fail(path, "__metadata__ must map strings to strings; key '" + key + "' holds a " +
                         value.type_name() + ".");
        }
        f.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) {
      fail_tensor(path, name,
                  std::string("entry is a ") + entry.type_name() +
                      ", expected an object with dtype, shape and data_offsets.");
    }
    TensorInfo t;
    t.name = name;

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      fail_tensor(path, name, "missing or non-string \"dtype\".");
    }
    t.dtype_name = dtype_it->get<std::string>();
    const DtypeSpec* spec = find_dtype(t.dtype_name);
    if (spec == nullptr) {
      fail_tensor(path, name,
                  "unknown dtype '" + t.dtype_name +
                      "' (not in the safetensors spec; this reader converts F32, F16 "
                      "and BF16).");
    }
    t.dtype = convertible_dtype(t.dtype_name);

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) {
      fail_tensor(path, name, "missing or non-array \"shape\".");
    }
    std::uint64_t numel = 1;
    for (const auto& d : *shape_it) {
      if (!d.is_number_unsigned()) {
        fail_tensor(path, name, "shape " + shape_it->dump() + " must hold non-negative integers.");
      }
      t.shape.push_back(d.get<std::uint64_t>());
      const auto m = mul_checked(numel, t.shape.back());
      if (!m) fail_tensor(path, name, "shape " + shape_it->dump() + " overflows 64 bits.");
      numel = *m;
    }
    t.numel = numel;

    const auto off_it = entry.find("data_offsets");
    if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
        !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
      fail_tensor(path, name, "\"data_offsets\" must be [begin, end] with non-negative integers.");
    }
    t.data_begin = (*off_it)[0].get<std::uint64_t>();
    t.data_end = (*off_it)[1].get<std::uint64_t>();
    if (t.data_end < t.data_begin) {
      fail_tensor(path, name, "data_offsets " + off_it->dump() + " end before they begin.");
    }
    const auto bits = mul_checked(numel, spec->bits);
    if (!bits || *bits % 8 != 0) {
      fail_tensor(path, name,
                  "shape " + shape_to_string(t.shape) + " of " + t.dtype_name +
                      " does not fill whole bytes.");
    }
    if (t.nbytes() != *bits / 8) {
      fail_tensor(path, name,
                  "shape " + shape_to_string(t.shape) + " of " + t.dtype_name + " needs " +
                      std::to_string(*bits / 8) + " bytes, but data_offsets " + off_it->dump() +
                      " span " + std::to_string(t.nbytes()) + " bytes.");
    }
    if (t.data_end > data_size) {
      fail_tensor(path, name,
                  "data_offsets " + off_it->dump() + " extend past the end of the data section (" +
                      std::to_string(data_size) + " bytes): the file is truncated or corrupted.");
    }
    f.tensors_.push_back(std::move(t));
  }

  // The tensors must tile the data section exactly: no overlaps, no gaps, nothing after.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(f.tensors_.size());
  for (const TensorInfo& t : f.tensors_)
    by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data_begin != b->data_begin ? a->data_begin < b->data_begin
                                          : a->data_end < b->data_end;
  });
  std::uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->data_begin < expected) {
      fail_tensor(path, t->name,
                  "bytes [" + std::to_string(t->data_begin) + ", " + std::to_string(t->data_end) +
                      ") overlap tensor '" + prev->name + "' [" + std::to_string(prev->data_begin) +
                      ", " + std::to_string(prev->data_end) + "). The file is corrupted.");
    }
    if (t->data_begin > expected) {
      fail_tensor(path, t->name,
                  "gap of " + std::to_string(t->data_begin - expected) + " bytes before it (at " +
                      std::to_string(expected) + ", " +
                      (prev ? "after tensor '" + prev->name + "'" : "at the start of the data") +
                      "): tensors must be contiguous. The file is corrupted.");
    }
    expected = t->data_end;
    prev = t;
  }
  if (expected != data_size) {
    fail(path, std::to_string(data_size - expected) +
                   " bytes after the last tensor are not described by the header (data section " +
                   std::to_string(data_size) + " bytes, tensors end at " +
                   std::to_string(expected) + "). The file is corrupted.");
  }

  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return f;
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
  read_converted(info(name), DType::kF32, out.data(), out.size());
}

void SafetensorsFile::read_u16(std::string_view name, std::span<std::uint16_t> out,
                               DType as) const {
  const TensorInfo& t = info(name);
  if (as == DType::kF32) {
    fail_tensor(path_, t.name, "read_u16 needs a 16-bit target dtype (F16 or BF16), not F32.");
  }
  read_converted(t, as, out.data(), out.size());
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

void SafetensorsFile::read_converted(const TensorInfo& t, DType out_dtype, void* out,
                                     std::size_t n) const {
  if (!t.dtype) {
    fail_tensor(path_, t.name,
                "dtype " + t.dtype_name +
                    " is not supported (supported: F32, F16, BF16). Convert the checkpoint to "
                    "one of those, or leave this tensor out.");
  }
  if (n != t.numel) {
    fail_tensor(path_, t.name,
                "destination holds " + std::to_string(n) + " elements, the tensor has " +
                    std::to_string(t.numel) + " (shape " + shape_to_string(t.shape) + ").");
  }
  const DType in = *t.dtype;
  const std::uint64_t base = data_start_ + t.data_begin;
  if (in == out_dtype) {  // same bits: straight into the destination
    pread_all(out, static_cast<std::size_t>(t.nbytes()), base, t);
    return;
  }
  const std::size_t in_size = dtype_size(in);
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

// ---- writer -------------------------------------------------------------------------------------

void SafetensorsWriter::check_new_name(const std::string& name) const {
  if (name.empty() || name == "__metadata__") {
    throw CheckpointError("safetensors writer: invalid tensor name '" + name + "'.");
  }
  if (entries_.count(name)) {
    throw CheckpointError("safetensors writer: tensor '" + name + "' added twice.");
  }
}

namespace {
std::uint64_t numel_of(const std::string& name, const std::vector<std::uint64_t>& shape,
                       std::size_t given) {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) {
    const auto m = mul_checked(n, d);
    if (!m) throw CheckpointError("safetensors writer: tensor '" + name + "' shape overflows.");
    n = *m;
  }
  if (n != given) {
    throw CheckpointError("safetensors writer: tensor '" + name + "' has shape " +
                          shape_to_string(shape) + " (" + std::to_string(n) + " elements) but " +
                          std::to_string(given) + " values were given.");
  }
  return n;
}
}  // namespace

void SafetensorsWriter::add(std::string name, std::vector<std::uint64_t> shape,
                            std::span<const float> data, DType dtype) {
  check_new_name(name);
  Entry e;
  e.numel = numel_of(name, shape, data.size());
  e.shape = std::move(shape);
  e.dtype = dtype;
  e.f32 = data.data();
  entries_.emplace(std::move(name), std::move(e));
}

void SafetensorsWriter::add_u16(std::string name, std::vector<std::uint64_t> shape,
                                std::span<const std::uint16_t> data, DType dtype) {
  check_new_name(name);
  if (dtype == DType::kF32) {
    throw CheckpointError("safetensors writer: tensor '" + name +
                          "': add_u16 takes F16 or BF16 words, not F32.");
  }
  Entry e;
  e.numel = numel_of(name, shape, data.size());
  e.shape = std::move(shape);
  e.dtype = dtype;
  e.u16 = data.data();
  entries_.emplace(std::move(name), std::move(e));
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::header() const {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  // transformers' from_pretrained rejects a safetensors file whose metadata lacks format=pt.
  std::map<std::string, std::string> meta = metadata_;
  meta.emplace("format", "pt");
  doc["__metadata__"] = meta;
  std::uint64_t offset = 0;
  for (const auto& [name, e] : entries_) {
    const std::uint64_t bytes = e.numel * dtype_size(e.dtype);
    doc[name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                 {"shape", e.shape},
                 {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = doc.dump();
  } catch (const nlohmann::json::type_error& e) {
    throw CheckpointError(std::string("safetensors writer: a tensor name or metadata string is "
                                      "not valid UTF-8 (") +
                          e.what() + ").");
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');  // data then starts 8-byte aligned
  return text;
}

std::uint64_t SafetensorsWriter::file_size() const {
  std::uint64_t data = 0;
  for (const auto& [name, e] : entries_)
    data += e.numel * dtype_size(e.dtype);
  return 8 + header().size() + data;
}

void SafetensorsWriter::stream(const ByteSink& sink) const {
  const std::string h = header();
  std::byte len[8];
  std::uint64_t n = h.size();
  for (auto& b : len) {
    b = static_cast<std::byte>(n & 0xFF);
    n >>= 8;
  }
  sink(len);
  sink(std::as_bytes(std::span(h.data(), h.size())));

  std::vector<std::uint16_t> buf;
  for (const auto& [name, e] : entries_) {
    const auto count = static_cast<std::size_t>(e.numel);
    if (e.u16 != nullptr) {
      sink(std::as_bytes(std::span(e.u16, count)));
    } else if (e.dtype == DType::kF32) {
      sink(std::as_bytes(std::span(e.f32, count)));
    } else {
      buf.resize(std::min(count, kChunkElems));
      for (std::size_t done = 0; done < count;) {
        const std::size_t k = std::min(count - done, kChunkElems);
        for (std::size_t i = 0; i < k; ++i) {
          const float x = e.f32[done + i];
          buf[i] = e.dtype == DType::kF16 ? float_to_half(x) : float_to_bf16(x);
        }
        sink(std::as_bytes(std::span(buf.data(), k)));
        done += k;
      }
    }
  }
}

void SafetensorsWriter::write(const fs::path& path) const {
  write_file_atomic(path, [this](const ByteSink& sink) { stream(sink); });
}

}  // namespace zo::ckpt
