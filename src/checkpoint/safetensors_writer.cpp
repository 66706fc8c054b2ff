// SafetensorsWriter: collects tensors, then emits the padded JSON header and the data, converting
// fp32 to F16 or BF16 where asked.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "checkpoint/safetensors_internal.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

void SafetensorsWriter::check_new_name(const std::string& name) const {
  if (name.empty() || name == "__metadata__") {
    throw CheckpointError("safetensors writer: invalid tensor name '" + name + "'.");
  }
  if (entries_.count(name)) {
    throw CheckpointError("safetensors writer: tensor '" + name + "' added twice.");
  }
}

namespace {
std::size_t element_size(const auto& e) {
  return e.u8 ? 1 : dtype_size(e.dtype);
}

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

void SafetensorsWriter::add_filled(std::string name, std::vector<std::uint64_t> shape, DType dtype,
                                   Fill fill) {
  check_new_name(name);
  std::uint64_t n = 1;
  for (std::uint64_t d : shape)
    n = mul_checked(n, d).value_or(0);
  Entry e;
  e.numel = numel_of(name, shape, static_cast<std::size_t>(n));
  e.shape = std::move(shape);
  e.dtype = dtype;
  e.fill = std::move(fill);
  entries_.emplace(std::move(name), std::move(e));
}

void SafetensorsWriter::add_filled_u8(std::string name, std::vector<std::uint64_t> shape,
                                      Fill fill) {
  const std::string key = name;
  add_filled(std::move(name), std::move(shape), DType::kF32, std::move(fill));
  entries_.at(key).u8 = true;
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::header() const {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  // transformers' from_pretrained rejects a safetensors file whose metadata lacks format=pt.
  std::map<std::string, std::string> meta = metadata_;
  meta.emplace("format", "pt");
  // Appended to the ordered object's vector: the names are unique already (entries_ is a map),
  // and operator[] would search all earlier keys for each, quadratic in the tensors.
  auto& fields = doc.get_ref<nlohmann::ordered_json::object_t&>();
  fields.emplace_back("__metadata__", meta);
  std::uint64_t offset = 0;
  for (const auto& [name, e] : entries_) {
    const std::uint64_t bytes = e.numel * element_size(e);
    fields.emplace_back(
        name, nlohmann::ordered_json{
                  {"dtype", e.u8 ? std::string_view("U8") : safetensors_dtype_name(e.dtype)},
                  {"shape", e.shape},
                  {"data_offsets", {offset, offset + bytes}}});
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
    data += e.numel * element_size(e);
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
  std::vector<std::byte> filled;
  for (const auto& [name, e] : entries_) {
    const auto count = static_cast<std::size_t>(e.numel);
    if (e.fill) {
      const std::size_t es = element_size(e);
      filled.resize(std::min(count, kFillElements) * es);
      for (std::size_t done = 0; done < count;) {
        const std::size_t k = std::min(count - done, kFillElements);
        const std::span<std::byte> out(filled.data(), k * es);
        e.fill(done, out);
        sink(out);
        done += k;
      }
    } else if (e.u16 != nullptr) {
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
