#include "train/moments_io.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/hf_weights.h"
#include "train/trainer_state.h"

namespace zo::train {
namespace fs = std::filesystem;
namespace {

const char* const kMoments[2] = {"exp_avg", "exp_avg_sq"};
const char* const kAbsmax[2] = {"exp_avg_absmax", "exp_avg_sq_absmax"};
constexpr std::size_t B = cpu_adam::kQ8Block;

std::string saved_dtype(StateFormat f) {
  return f == StateFormat::kF32 ? "F32" : f == StateFormat::kBF16 ? "BF16" : "U8";
}

// The stored dtype each moment tensor of format f must have; q8's block maxima are F32.
void expect_dtype(const ckpt::SafetensorsFile& file, const std::string& name, StateFormat f,
                  bool absmax = false) {
  const std::string& d = file.info(name).dtype_name;
  const std::string want = absmax ? "F32" : saved_dtype(f);
  if (d != want) {
    throw CheckpointError("checkpoint file '" + file.path().string() + "': tensor '" + name +
                          "' is " + d + ", but trainer_state.json says the optimizer state is " +
                          std::string(state_format_name(f)) + ", whose " +
                          (absmax ? "block maxima are " : "moments are ") + want +
                          "; the checkpoint is damaged. Resume from an earlier one");
  }
}

// Block maxima as read: an update writes 0, a positive normal float or NaN (a moment that was
// not finite, which the resume then refuses naming the tensor). Anything else (a negative one
// would flip the block's m) means the file was changed after it was saved, its checksum with it.
// `what` names the tensor read.
void check_block_maxima(const ckpt::SafetensorsFile& file, const std::string& what,
                        std::span<const float> absmax, std::size_t first_block) {
  for (std::size_t b = 0; b < absmax.size(); ++b) {
    const float a = absmax[b];
    if (std::isnan(a) || (!std::signbit(a) && (a == 0.0f || std::isnormal(a)))) continue;
    char shown[32];
    std::snprintf(shown, sizeof shown, "%.9g", double(a));
    throw CheckpointError("checkpoint file '" + file.path().string() + "': " + what + " holds " +
                          std::string(shown) + " as the maximum of block " +
                          std::to_string(first_block + b) +
                          "; the trainer writes only 0, a positive normal number or NaN there, "
                          "so the file was changed after it was saved. Resume from an earlier "
                          "checkpoint");
  }
}

// m[code] * absmax for every code of `codes`, the blocks' maxima from absmax[first_block].
void dequantize(int k, std::span<const std::uint8_t> codes, std::size_t first_in_block,
                const float* absmax, std::span<float> out) {
  const auto map = cpu_adam::q8_map(k == 0);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const float v = codes[i] < map.size() ? map[codes[i]] : std::numeric_limits<float>::quiet_NaN();
    out[i] = v * absmax[(first_in_block + i) / B];
  }
}

// Moment k of layout elements [begin, begin + out.size()) as fp32; a piece lies in one tensor.
class MomentSource {
 public:
  virtual ~MomentSource() = default;
  virtual void read(int k, std::size_t begin, std::span<float> out) = 0;
};

// An optimizer file holds at most four tensors per parameter tensor (m, v and q8's two maxima).
std::uint64_t header_limit(const model::ParameterLayout& layout) {
  return ckpt::safetensors_header_limit(4 * layout.tensors().size());
}

// optimizer.safetensors. A transposed (GPT-2 Conv1D) tensor, at most 4 C^2, is read whole once
// and kept while its pieces are asked for.
class WholeSource final : public MomentSource {
 public:
  WholeSource(const fs::path& file, const model::ParameterLayout& layout, StateFormat f)
      : file_(ckpt::SafetensorsFile::open(file, header_limit(layout))), layout_(layout), f_(f) {
    std::set<std::string> names;
    for (int k = 0; k < 2; ++k) {
      for (const auto& t : layout.tensors()) {
        const std::string name = std::string(kMoments[k]) + "." + t.name;
        names.insert(name);
        file_.expect_shape(name, model::hf_shape(t));
        expect_dtype(file_, name, f);
        if (f != StateFormat::kQ8) continue;
        const std::string am = std::string(kAbsmax[k]) + "." + t.name;
        names.insert(am);
        file_.expect_shape(am, {cpu_adam::q8_blocks(t.numel)});
        expect_dtype(file_, am, f, true);
      }
    }
    expect_only(file_, names);
  }

  void read(int k, std::size_t begin, std::span<float> out) override {
    const model::TensorInfo& t = layout_.tensor_at(begin);
    const std::size_t first = begin - t.offset;
    const std::string name = std::string(kMoments[k]) + "." + t.name;
    if (f_ != StateFormat::kQ8) {
      if (!t.hf_transposed) return file_.read_f32(name, out, first);
      if (cached(k, t)) {
        hf_.resize(t.numel);
        file_.read_f32(name, hf_);
        ours_.resize(t.numel);
        model::from_hf(t, hf_.data(), ours_.data());
      }
      std::copy_n(ours_.data() + first, out.size(), out.data());
      return;
    }
    if (cached(k, t)) {
      absmax_.resize(cpu_adam::q8_blocks(t.numel));
      const std::string am = std::string(kAbsmax[k]) + "." + t.name;
      file_.read_f32(am, absmax_);
      check_block_maxima(file_, "tensor '" + am + "'", absmax_, 0);
      if (t.hf_transposed) {
        std::vector<std::uint8_t> hf(t.numel);
        file_.read_u8(name, hf, 0);
        codes_.resize(t.numel);
        model::from_hf(t, hf.data(), codes_.data());
      }
    }
    std::span<const std::uint8_t> codes;
    if (t.hf_transposed) {
      codes = std::span<const std::uint8_t>(codes_.data() + first, out.size());
    } else {
      piece_.resize(out.size());
      file_.read_u8(name, piece_, first);
      codes = piece_;
    }
    dequantize(k, codes, first, absmax_.data(), out);
  }

 private:
  // True when moment k of t is not the one held: it becomes the one held.
  bool cached(int k, const model::TensorInfo& t) {
    const bool fresh = held_k_ != k || held_ != &t;
    held_k_ = k;
    held_ = &t;
    return fresh;
  }

  ckpt::SafetensorsFile file_;
  const model::ParameterLayout& layout_;
  StateFormat f_;
  int held_k_ = -1;
  const model::TensorInfo* held_ = nullptr;
  std::vector<float> hf_, ours_, absmax_;
  std::vector<std::uint8_t> codes_, piece_;
};

// optimizer.rank<r>-of<N>.safetensors of every rank, each in its own local order. The q8 blocks
// of a shard follow its segments, found from its ranges as optim::HostOptimizer finds them.
class ShardedSource final : public MomentSource {
 public:
  ShardedSource(const fs::path& dir, const nlohmann::json& shards,
                const model::ParameterLayout& layout, StateFormat f)
      : layout_(layout), f_(f) {
    for (const ShardFile& sf : shard_files(shards, layout.size(), dir)) {
      std::error_code ec;
      if (!fs::exists(dir / sf.name, ec)) {
        throw CheckpointError("checkpoint '" + dir.string() + "' lacks " + sf.name +
                              ", the optimizer shard trainer_state.json names (optimizer_shards); "
                              "the checkpoint was copied in part or changed after the save. "
                              "Copy the whole checkpoint directory, or resume from an earlier one");
      }
      files_.push_back(ckpt::SafetensorsFile::open(dir / sf.name, header_limit(layout)));
      const ckpt::SafetensorsFile& file = files_.back();
      std::vector<optim::OwnedRange> ranges;
      std::size_t local = 0;
      for (const auto& [b, e] : sf.ranges) {
        ranges.push_back({b, e, local});
        local += e - b;
      }
      std::size_t blocks = 0;
      for (const optim::OwnedRange& o : ranges) {
        for (const auto& t : layout.tensors()) {
          const std::size_t lb = std::max(o.begin, t.offset),
                            le = std::min(o.end, t.offset + t.numel);
          if (lb >= le) continue;
          segments_.push_back({lb, o.local + (lb - o.begin), le - lb, blocks, files_.size() - 1});
          blocks += cpu_adam::q8_blocks(le - lb);
        }
      }
      std::set<std::string> names;
      for (int k = 0; k < 2; ++k) {
        names.insert(kMoments[k]);
        const std::uint64_t n = file.info(kMoments[k]).numel;
        if (n != sf.local_size) {  // not this rank's ranges: swapped or replaced shards
          throw CheckpointError(
              "checkpoint file '" + file.path().string() + "': tensor '" + kMoments[k] +
              "' holds " + std::to_string(n) + " elements, but trainer_state.json gives this " +
              "shard " + std::to_string(sf.local_size) + " (its optimizer_shards ranges); the " +
              "shard files were swapped or changed after the save. Resume from an earlier " +
              "checkpoint");
        }
        file.expect_shape(kMoments[k], {sf.local_size});
        expect_dtype(file, kMoments[k], f);
        if (f != StateFormat::kQ8) continue;
        names.insert(kAbsmax[k]);
        file.expect_shape(kAbsmax[k], {blocks});
        expect_dtype(file, kAbsmax[k], f, true);
      }
      expect_only(file, names);
    }
    std::sort(segments_.begin(), segments_.end(),
              [](const Old& a, const Old& b) { return a.layout < b.layout; });
  }

  void read(int k, std::size_t begin, std::span<float> out) override {
    const std::size_t end = begin + out.size();
    auto it = std::upper_bound(segments_.begin(), segments_.end(), begin,
                               [](std::size_t v, const Old& s) { return v < s.layout; });
    for (--it; it != segments_.end() && it->layout < end; ++it) {
      const std::size_t lo = std::max(begin, it->layout), hi = std::min(end, it->layout + it->len);
      const ckpt::SafetensorsFile& file = files_[it->file];
      const std::size_t local = it->local + (lo - it->layout);
      const std::span<float> part = out.subspan(lo - begin, hi - lo);
      if (f_ != StateFormat::kQ8) {
        file.read_f32(kMoments[k], part, local);
        continue;
      }
      const std::size_t in_segment = lo - it->layout, b0 = in_segment / B;
      const std::size_t b1 = (in_segment + part.size() - 1) / B + 1;
      absmax_.resize(b1 - b0);
      file.read_f32(kAbsmax[k], absmax_, it->block + b0);
      check_block_maxima(file,
                         "tensor '" + std::string(kAbsmax[k]) + "' (the blocks of '" +
                             layout_.tensor_at(it->layout).name + "')",
                         absmax_, it->block + b0);
      codes_.resize(part.size());
      file.read_u8(kMoments[k], codes_, local);
      dequantize(k, codes_, in_segment - b0 * B, absmax_.data(), part);
    }
  }

 private:
  struct Old {  // a segment of a shard: layout elements, their local start, and its first block
    std::size_t layout, local, len, block, file;
  };
  const model::ParameterLayout& layout_;
  StateFormat f_;
  std::vector<ckpt::SafetensorsFile> files_;
  std::vector<Old> segments_;  // of every shard, by layout
  std::vector<float> absmax_;
  std::vector<std::uint8_t> codes_;
};

// A reader of moment k as stored, T its storage type (float, bf16 bits or q8 codes).
template <class T>
std::shared_ptr<model::RangedHfReader<T>> stored_moment(optim::HostOptimizer& opt, int k) {
  return std::make_shared<model::RangedHfReader<T>>(
      [&opt, k](std::size_t offset, std::size_t n, T* out) {
        opt.read_moment_stored(k, offset, n, out);
      });
}

template <class T>
ckpt::SafetensorsWriter::Fill ranged_fill(std::shared_ptr<model::RangedHfReader<T>> read,
                                          const model::TensorInfo& t) {
  return [read, &t](std::uint64_t first, std::span<std::byte> out) {
    (*read)(t, first, out.size() / sizeof(T), reinterpret_cast<T*>(out.data()));
  };
}

// add_whole_moments for a state on a drive, which has no whole arrays: every fill reads the
// optimizer by range, the same bytes in the same order.
void add_ranged_moments(ckpt::SafetensorsWriter& w, const model::ParameterLayout& layout,
                        optim::HostOptimizer& opt) {
  const StateFormat f = opt.state_format();
  for (int k = 0; k < 2; ++k) {
    // One reader per moment: a transposed tensor's copy lives while its pieces are written.
    const auto f32 = stored_moment<float>(opt, k);
    const auto bf16 = stored_moment<std::uint16_t>(opt, k);
    const auto q8 = stored_moment<std::uint8_t>(opt, k);
    for (std::size_t i = 0; i < layout.tensors().size(); ++i) {
      const model::TensorInfo& t = layout.tensors()[i];
      const std::string name = std::string(kMoments[k]) + "." + t.name;
      if (f == StateFormat::kF32) {
        w.add_filled(name, model::hf_shape(t), DType::kF32, ranged_fill(f32, t));
        continue;
      }
      if (f == StateFormat::kBF16) {
        w.add_filled(name, model::hf_shape(t), DType::kBF16, ranged_fill(bf16, t));
        continue;
      }
      w.add_filled_u8(name, model::hf_shape(t), ranged_fill(q8, t));
      // One process: one segment per tensor, in the layout's order.
      const std::size_t blocks = cpu_adam::q8_blocks(t.numel);
      w.add_filled(std::string(kAbsmax[k]) + "." + t.name, {blocks}, DType::kF32,
                   [&opt, k, i](std::uint64_t first, std::span<std::byte> out) {
                     std::vector<float> piece(out.size() / sizeof(float));
                     opt.read_q8_absmax(k, i, first, piece);
                     std::memcpy(out.data(), piece.data(), out.size());
                   });
    }
  }
}

}  // namespace

void add_whole_moments(ckpt::SafetensorsWriter& w, const model::ParameterLayout& layout,
                       optim::HostOptimizer& opt) {
  if (opt.on_drive()) {
    add_ranged_moments(w, layout, opt);
    return;
  }
  const StateFormat f = opt.state_format();
  for (int k = 0; k < 2; ++k) {
    for (std::size_t i = 0; i < layout.tensors().size(); ++i) {
      const model::TensorInfo& t = layout.tensors()[i];
      const std::string name = std::string(kMoments[k]) + "." + t.name;
      if (f == StateFormat::kQ8) {
        const optim::HostOptimizer::Q8Arrays q = opt.q8();
        const std::uint8_t* codes = (k == 0 ? q.m : q.v).data() + t.offset;
        w.add_filled_u8(name, model::hf_shape(t),
                        [codes, &t](std::uint64_t first, std::span<std::byte> out) {
                          model::to_hf(t, codes, first, out.size(),
                                       reinterpret_cast<std::uint8_t*>(out.data()));
                        });
        // One process: one segment per tensor, in the layout's order.
        const float* absmax = (k == 0 ? q.m_absmax : q.v_absmax).data() + opt.segments()[i].block;
        w.add(std::string(kAbsmax[k]) + "." + t.name, {cpu_adam::q8_blocks(t.numel)},
              std::span<const float>(absmax, cpu_adam::q8_blocks(t.numel)));
        continue;
      }
      const void* array = (k == 0 ? opt.exp_avg() : opt.exp_avg_sq()).data;
      const DType sd = f == StateFormat::kF32 ? DType::kF32 : DType::kBF16;
      w.add_filled(name, model::hf_shape(t), sd,
                   [array, &t, sd](std::uint64_t first, std::span<std::byte> out) {
                     if (sd == DType::kF32) {
                       model::to_hf(t, static_cast<const float*>(array) + t.offset, first,
                                    out.size() / 4, reinterpret_cast<float*>(out.data()));
                     } else {
                       model::to_hf(t, static_cast<const std::uint16_t*>(array) + t.offset, first,
                                    out.size() / 2, reinterpret_cast<std::uint16_t*>(out.data()));
                     }
                   });
    }
  }
}

// Read by range whatever the store (in memory or on a drive): the same bytes either way.
void add_shard_moments(ckpt::SafetensorsWriter& w, optim::HostOptimizer& opt) {
  const StateFormat f = opt.state_format();
  const std::size_t n = opt.size(), sb = state_element_bytes(f);
  for (int k = 0; k < 2; ++k) {
    auto moments = [&opt, k, sb](std::uint64_t first, std::span<std::byte> out) {
      opt.read_moment_stored(k, first, out.size() / sb, out.data());
    };
    if (f != StateFormat::kQ8) {
      w.add_filled(kMoments[k], {n}, f == StateFormat::kF32 ? DType::kF32 : DType::kBF16, moments);
      continue;
    }
    w.add_filled_u8(kMoments[k], {n}, moments);
    // The block maxima of every segment, back to back: blocks [first, first + count) are read
    // from the segments they fall in.
    w.add_filled(kAbsmax[k], {opt.q8_block_total()}, DType::kF32,
                 [&opt, k](std::uint64_t first, std::span<std::byte> out) {
                   const std::size_t count = out.size() / sizeof(float);
                   std::vector<float> part;
                   for (std::size_t i = 0; i < opt.segments().size(); ++i) {
                     const optim::HostOptimizer::Segment& s = opt.segments()[i];
                     const std::size_t b0 = s.block,
                                       b1 = s.block + cpu_adam::q8_blocks(s.end - s.begin);
                     const std::size_t lo = std::max<std::size_t>(b0, first),
                                       hi = std::min<std::size_t>(b1, first + count);
                     if (lo >= hi) continue;
                     part.resize(hi - lo);
                     opt.read_q8_absmax(k, i, lo - b0, part);
                     std::memcpy(out.data() + (lo - first) * sizeof(float), part.data(),
                                 part.size() * sizeof(float));
                   }
                 });
  }
}

void load_moments(const fs::path& dir, const nlohmann::json& state,
                  const model::ParameterLayout& layout, optim::HostOptimizer& opt) {
  const StateFormat saved =
      parse_state_format(state.value("optimizer_state_dtype", std::string("fp32")));
  std::unique_ptr<MomentSource> source;
  if (state.contains("optimizer_shards")) {
    source = std::make_unique<ShardedSource>(dir, state.at("optimizer_shards"), layout, saved);
  } else {
    source = std::make_unique<WholeSource>(dir / "optimizer.safetensors", layout, saved);
  }
  // Pieces of whole q8 blocks (kImportPieceElements is a multiple of kQ8Block).
  static_assert(model::kImportPieceElements % B == 0);
  std::vector<float> piece;
  for (const optim::HostOptimizer::Segment& s : opt.segments()) {
    for (int k = 0; k < 2; ++k) {
      for (std::size_t off = 0; off < s.end - s.begin; off += model::kImportPieceElements) {
        piece.resize(std::min(model::kImportPieceElements, s.end - s.begin - off));
        source->read(k, s.layout + off, piece);
        opt.write_moment(k, s.begin + off, piece);
      }
    }
  }
}

}  // namespace zo::train
