// The safetensors format's vocabulary (dtypes, shapes) and SafetensorsFile::open, which parses the
// JSON header and checks it against the file before any tensor is read.
#include "checkpoint/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <utility>

#include "checkpoint/atomic_io_internal.h"
#include "checkpoint/json_input.h"
#include "checkpoint/safetensors_internal.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

namespace {

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

}  // namespace

[[noreturn]] void fail(const fs::path& p, const std::string& what) {
  throw CheckpointError(prefix(p) + what);
}

[[noreturn]] void fail_tensor(const fs::path& p, const std::string& name, const std::string& what) {
  throw CheckpointError(prefix(p) + "tensor '" + name + "': " + what);
}

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

SafetensorsFile SafetensorsFile::open(const fs::path& path, std::uint64_t max_header) {
  SafetensorsFile f;
  f.path_ = path;
  std::string problem;
  f.fd_ = open_regular_file(path, problem).release();
  if (f.fd_ < 0) {
    fail(path, "cannot open: it " + problem +
                   ". Give the path of a .safetensors file (--init-from, --checkpoint, --resume).");
  }
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) fail(path, "cannot stat: " + errno_text(errno) + ".");
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
  if (header_len > max_header) {
    fail(path, "header length " + std::to_string(header_len) +
                   " bytes is more than the tensors expected here need (limit " +
                   std::to_string(max_header) +
                   "): it lists far more tensors than the model has. Give the weights of "
                   "this model.");
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
    doc = parse_json(header);
  } catch (const JsonError& e) {
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

}  // namespace zo::ckpt
