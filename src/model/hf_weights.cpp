#include "model/hf_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_set.h"
#include "core/error.h"

namespace zo::model {

std::vector<std::uint64_t> hf_shape(const TensorInfo& t) {
  std::vector<std::uint64_t> s(t.shape.begin(), t.shape.end());
  if (t.hf_transposed) std::swap(s[0], s[1]);
  return s;
}

std::string hf_index(const TensorInfo& t, std::size_t i) {
  std::vector<std::size_t> at(t.shape.size());
  for (std::size_t d = at.size(); d-- > 0;) {
    at[d] = i % t.shape[d];
    i /= t.shape[d];
  }
  if (t.hf_transposed) std::swap(at[0], at[1]);
  std::string s = "[";
  for (std::size_t d = 0; d < at.size(); ++d)
    s += (d ? ", " : "") + std::to_string(at[d]);
  return s + "]";
}

template <class T>
void to_hf(const TensorInfo& t, const T* ours, std::uint64_t first, std::size_t n, T* hf) {
  if (!t.hf_transposed) {
    std::copy(ours + first, ours + first + n, hf);
    return;
  }
  // HF element k of (in, out) = (cols, rows) is ours[r * cols + c] with c = k / rows, r = k % rows.
  const std::size_t rows = t.shape[0], cols = t.shape[1];
  std::size_t c = static_cast<std::size_t>(first / rows),
              r = static_cast<std::size_t>(first % rows);
  for (std::size_t i = 0; i < n; ++i) {
    hf[i] = ours[r * cols + c];
    if (++r == rows) {
      r = 0;
      ++c;
    }
  }
}

template <class T>
void from_hf(const TensorInfo& t, const T* hf, T* ours) {
  if (!t.hf_transposed) {
    std::copy(hf, hf + t.numel, ours);
    return;
  }
  const std::size_t rows = t.shape[0], cols = t.shape[1];
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c)
      ours[r * cols + c] = hf[c * rows + r];
  }
}

template void to_hf<float>(const TensorInfo&, const float*, std::uint64_t, std::size_t, float*);
template void to_hf<std::uint16_t>(const TensorInfo&, const std::uint16_t*, std::uint64_t,
                                   std::size_t, std::uint16_t*);
template void from_hf<float>(const TensorInfo&, const float*, float*);
template void from_hf<std::uint16_t>(const TensorInfo&, const std::uint16_t*, std::uint16_t*);
template void to_hf<std::uint8_t>(const TensorInfo&, const std::uint8_t*, std::uint64_t,
                                  std::size_t, std::uint8_t*);
template void from_hf<std::uint8_t>(const TensorInfo&, const std::uint8_t*, std::uint8_t*);

namespace {

// Buffers some HF files carry: constants of the architecture, not parameters (GPT-2's causal
// mask, older Llama saves' RoPE frequencies).
bool hf_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with(".self_attn.rotary_emb.inv_freq");
}

std::string strip_prefix(const std::string& name) {
  const std::string p = "transformer.";
  return name.rfind(p, 0) == 0 ? name.substr(p.size()) : name;
}

}  // namespace

HfSource hf_source(std::span<const float> params) {
  return [params](const TensorInfo& t, std::uint64_t first, std::span<float> out) {
    to_hf(t, params.data() + t.offset, first, out.size(), out.data());
  };
}

void import_hf_weights(const std::filesystem::path& path, const ParameterLayout& layout,
                       std::span<float> params) {
  if (params.size() != layout.size()) throw std::invalid_argument("import: params size mismatch");
  import_hf_weights(path, layout, [params](std::size_t offset, std::span<const float> v) {
    std::copy(v.begin(), v.end(), params.begin() + std::ptrdiff_t(offset));
  });
}

void import_hf_weights(const std::filesystem::path& path, const ParameterLayout& layout,
                       const ParamSink& sink) {
  // Room for every tensor of the model and as many others (GPT-2 files add attention buffers).
  const auto file =
      ckpt::SafetensorsSet::open(path, ckpt::safetensors_header_limit(4 * layout.tensors().size()));
  std::map<std::string, std::string> by_name;  // our name -> name in the file
  std::vector<std::string> unexpected, twice;
  std::string lm_head;  // the file's name for an explicit LM head, if it has one
  std::set<std::string> ours;
  for (const auto& t : layout.tensors())
    ours.insert(t.name);
  for (const auto& info : file.tensors()) {
    const std::string n = strip_prefix(info.name);
    if (ours.count(n)) {
      const auto [it, fresh] = by_name.emplace(n, info.name);
      if (!fresh) twice.push_back(it->second + " and " + info.name);
    } else if (n == "lm_head.weight") {
      lm_head = info.name;
    } else if (!hf_buffer(n)) {
      unexpected.push_back(info.name);
    }
  }
  std::vector<std::string> missing, misshaped;
  const TensorInfo& wte = layout.tensors().front();  // wte / embed_tokens: the tied LM head
  if (!lm_head.empty() && file.info(lm_head).shape != hf_shape(wte)) {
    misshaped.push_back(lm_head + " is " + ckpt::shape_to_string(file.info(lm_head).shape) +
                        ", expected " + ckpt::shape_to_string(hf_shape(wte)) + " (tied to " +
                        wte.name + ")");
  }
  for (const auto& t : layout.tensors()) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      missing.push_back(t.name);
      continue;
    }
    const auto& info = file.info(it->second);
    if (info.shape != hf_shape(t)) {
      misshaped.push_back(it->second + " is " + ckpt::shape_to_string(info.shape) + ", expected " +
                          ckpt::shape_to_string(hf_shape(t)));
    }
  }
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty() || !twice.empty()) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (std::size_t i = 0; i < v.size() && i < 8; ++i)
        s += (i ? ", " : "") + v[i];
      if (v.size() > 8) s += ", ... (" + std::to_string(v.size()) + " in all)";
      return s;
    };
    std::string msg = "weights " + path.string() + " do not fit model '" + layout.spec().name +
                      "' (n_layer " + std::to_string(layout.spec().n_layer) + ", n_embd " +
                      std::to_string(layout.spec().n_embd) + ", vocab " +
                      std::to_string(layout.spec().vocab_size) + "):";
    if (!missing.empty()) msg += " missing: " + list(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected: " + list(unexpected) + ";";
    if (!twice.empty())
      msg += " given twice (with and without 'transformer.'): " + list(twice) + ";";
    if (!misshaped.empty()) msg += " wrong shape: " + list(misshaped) + ";";
    msg += " pass the --model spec these weights were trained with";
    throw CheckpointError(msg);
  }
  // A tied LM head is wte; a file with a different one is another model.
  std::vector<float> buf, other;
  if (!lm_head.empty()) {
    for (std::uint64_t first = 0; first < wte.numel; first += kImportPieceElements) {
      const auto n = static_cast<std::size_t>(
          std::min<std::uint64_t>(kImportPieceElements, wte.numel - first));
      buf.resize(n);
      other.resize(n);
      file.read_f32(lm_head, buf, first);
      file.read_f32(by_name.at(wte.name), other, first);
      if (std::memcmp(buf.data(), other.data(), n * sizeof(float)) == 0) continue;
      throw CheckpointError(
          "weights " + path.string() + ": " + lm_head + " differs from " + by_name.at(wte.name) +
          "; this model ties the LM head to the token embedding, so untied "
          "weights cannot be loaded (drop " +
          lm_head + " only if it is meant to equal " + wte.name +
          (layout.spec().llama() ? ", or use a spec with tie_word_embeddings false)"
                                 : "; GPT-2 always ties them)"));
    }
  }
  for (const auto& t : layout.tensors()) {
    const std::string& name = by_name.at(t.name);
    if (t.hf_transposed) {  // a GPT-2 Conv1D weight (at most 4 C^2): whole, then transposed
      buf.resize(t.numel);
      other.resize(t.numel);
      file.read_f32(name, buf);
      from_hf(t, buf.data(), other.data());
      sink(t.offset, other);
      continue;
    }
    for (std::uint64_t first = 0; first < t.numel; first += kImportPieceElements) {
      buf.resize(
          static_cast<std::size_t>(std::min<std::uint64_t>(kImportPieceElements, t.numel - first)));
      file.read_f32(name, buf, first);
      sink(t.offset + static_cast<std::size_t>(first), buf);
    }
  }
}

ckpt::SafetensorsWriter::Fill hf_fill(const TensorInfo& t, const HfSource& source, DType dtype) {
  return [source, &t, dtype](std::uint64_t first, std::span<std::byte> out) {
    const std::size_t n = out.size() / dtype_size(dtype);
    if (dtype == DType::kF32) {
      source(t, first, {reinterpret_cast<float*>(out.data()), n});
      return;
    }
    std::vector<float> f32(n);
    source(t, first, f32);
    convert_from_float(f32.data(), out.data(), dtype, n);
  };
}

void add_hf_weights(ckpt::SafetensorsWriter& writer, const ParameterLayout& layout,
                    const HfSource& source, DType dtype) {
  for (const auto& t : layout.tensors())
    writer.add_filled(t.name, hf_shape(t), dtype, hf_fill(t, source, dtype));
}

void export_hf_weights(const std::filesystem::path& path, const ParameterLayout& layout,
                       const HfSource& source, DType dtype) {
  ckpt::SafetensorsWriter writer;
  add_hf_weights(writer, layout, source, dtype);
  writer.set_metadata("format", "pt");
  writer.set_metadata("model", layout.spec().to_json().dump());
  writer.write(path);
}

}  // namespace zo::model
