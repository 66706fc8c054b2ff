// The host side of training: master weights (fp32, or bf16 rounded stochastically) and Adam
// moments in NUMA-placed host memory,
// updated by cpu_adam with per-tensor weight decay (decay and no-decay tensors interleave in the
// forward-order layout, so the update runs over maximal runs of equal decay).
//
// Data parallel (ZeRO-2 with offload, docs/scale_out.md): a rank owns a partition of the layout,
// a list of ranges stored back to back in its arrays ("local" order), so master, m and v take
// 1/ranks of the host memory. A single process owns one range, the whole layout, at local 0.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/state_format.h"
#include "cpu_adam/cpu_adam.h"
#include "model/layout.h"
#include "optim/state_pager.h"
#include "pinned_memory/host_buffer.h"
#include "pinned_memory/pinned_buffer.h"
#include "state_io/io_queue.h"

namespace zo::optim {

struct OptimizerConfig {
  AdamConfig adam;  // lr is set per step from the schedule
  model::WeightDecayPolicy decay_policy;
  StateFormat state_format = StateFormat::kF32;  // m and v: fp32, bf16 or q8
  // Master weights: kF32, or kBF16 rounded stochastically by cpu_adam from random bits keyed by
  // (seed, Adam step, layout index), so a run is reproducible bit for bit across resumes.
  DType master_dtype = DType::kF32;
  std::uint64_t seed = 0;
  // Page-locks the master weights when the offload engine uploads straight from them (the
  // master is in the device's dtype). Its placement is ignored: pages land where the Adam thread
  // that updates them first touches them.
  pinned::PinOptions master_pin = {.enable = false};
  int threads = 0;  // 0: all cores
  // Non-empty: master, m and v live in an unnamed file in this directory (--state-dir,
  // StatePager), chunks of at most state_chunk_elements paged through state_slots staging
  // slots; empty: in host memory.
  std::filesystem::path state_dir;
  std::size_t state_chunk_elements = kDefaultChunkElements;
  std::size_t state_slots = kDefaultStagingSlots;
  state_io::QueueOptions state_queue;  // io_uring or threads (tests: kThreads, a fault hook)
};

// Layout elements [begin, end) stored at [local, local + end - begin) of the rank's arrays.
struct OwnedRange {
  std::size_t begin = 0, end = 0, local = 0;
  bool operator==(const OwnedRange&) const = default;
};

class HostOptimizer {
 public:
  // owned: ascending, disjoint, non-empty ranges with local offsets 0, 1st size, ...; empty
  // means the whole layout.
  HostOptimizer(const model::ParameterLayout& layout, const OptimizerConfig& config,
                std::vector<OwnedRange> owned = {});
  ~HostOptimizer();

  std::size_t size() const { return n_; }  // owned elements (the whole layout: layout size)
  std::size_t layout_size() const { return layout_n_; }
  bool owns_all() const { return n_ == layout_n_; }
  const std::vector<OwnedRange>& owned() const { return owned_; }
  // local (size()) := the owned elements of full (layout_size()).
  template <class T>
  void take_owned(const T* full, T* local) const {
    for (const OwnedRange& o : owned_)
      std::copy(full + o.begin, full + o.end, local + o.local);
  }
  // The same for a piece: `values` are layout elements [offset, offset + values.size()).
  template <class T>
  void take_owned(std::size_t offset, std::span<const T> values, T* local) const {
    for_owned(offset, values.size(), [&](std::size_t from, std::size_t to, std::size_t n) {
      std::copy_n(values.data() + from, n, local + to);
    });
  }
  // Calls f(from, to, n) for each owned part of layout elements [offset, offset + count): n
  // elements from `from` within that range go to local index `to`.
  template <class F>
  void for_owned(std::size_t offset, std::size_t count, F&& f) const {
    for (const OwnedRange& o : owned_) {
      const std::size_t lo = std::max(offset, o.begin), hi = std::min(offset + count, o.end);
      if (lo < hi) f(lo - offset, o.local + (lo - o.begin), hi - lo);
    }
  }

  DType master_dtype() const { return config_.master_dtype; }
  // The state is in files on a drive (OptimizerConfig::state_dir): the whole-array accessors
  // (master_data, master, exp_avg, exp_avg_sq, q8) throw std::logic_error; read and write by range.
  bool on_drive() const { return pager_ != nullptr; }
  // On a drive: starts reading the chunks an update begins with (the lowest local elements), so
  // that they arrive while the device computes the next step. Nothing in memory.
  void read_ahead_first_chunks();
  // The drive's pager (null in memory): chunks, bytes moved, what the log says.
  const StatePager* pager() const { return pager_.get(); }
  StatePager* pager() { return pager_.get(); }
  // The master weights (size() elements of master_dtype()).
  void* master_data();
  // The fp32 master weights (throws std::logic_error with a bf16 master: see read_master).
  std::span<float> master();
  // Master weights of local elements [begin, begin + out.size()) as fp32 (bf16: exact).
  void read_master(std::size_t begin, std::span<float> out) const;
  // Sets them from fp32 values (bf16 master: rounded to nearest even).
  void write_master(std::size_t begin, std::span<const float> values);
  // Sets the owned part of layout elements [offset, offset + values.size()): an import sink.
  void put_master(std::size_t offset, std::span<const float> values) {
    for_owned(offset, values.size(), [&](std::size_t from, std::size_t to, std::size_t n) {
      write_master(to, values.subspan(from, n));
    });
  }
  // The owned master weights of layout range [begin, end) converted to `dtype`, into out (size()
  // elements of dtype, written at the same local positions).
  void copy_master_as(std::size_t begin, std::size_t end, DType dtype, void* out);
  // m and v in fp32 or bf16 (throws std::logic_error for q8 state: see q8()).
  cpu_adam::ArrayView exp_avg() { return moment_view(m_); }
  cpu_adam::ArrayView exp_avg_sq() { return moment_view(v_); }
  cpu_adam::AdamState& state() { return state_; }
  const OptimizerConfig& config() const { return config_; }
  StateFormat state_format() const { return config_.state_format; }

  // One tensor's elements in one owned range: local [begin, end), layout elements from `layout`.
  // Updates, and the 8-bit state's blocks (numbered from `block` in the absmax arrays, the first
  // starting at `begin`), never cross one.
  struct Segment {
    std::size_t begin, end, layout, block;
    bool decay;
  };
  const std::vector<Segment>& segments() const { return segments_; }
  // q8 blocks over every segment (each segment's blocks numbered on from the previous one's).
  std::size_t q8_block_total() const { return blocks_; }

  // q8 state: codes of m and v (size()), and each segment's block maxima.
  struct Q8Arrays {
    std::span<std::uint8_t> m, v;
    std::span<float> m_absmax, v_absmax;
  };
  Q8Arrays q8();

  // Moment k (0: m, 1: v) of local elements [begin, begin + out.size()) as fp32, in any format
  // (q8: dequantized).
  void read_moment(int k, std::size_t begin, std::span<float> out);
  // Moment k of local elements [begin, begin + n) as stored (fp32, bf16 bits or q8 codes), into
  // out (n elements of state_element_bytes). Any store, on a drive too.
  void read_moment_stored(int k, std::size_t begin, std::size_t n, void* out) const;
  // The q8 block maxima of moment k of segments()[i], its blocks [first, first + out.size()),
  // into out (on a drive only the chunks holding them are read).
  void read_q8_absmax(int k, std::size_t i, std::size_t first, std::span<float> out) const;
  // Sets moment k of local elements [begin, begin + values.size()) from fp32 values, stored in
  // the state format (bf16: rounded to nearest even; q8: quantized over new block maxima, so the
  // range must start at a block of one segment and end at a block's end or the segment's end).
  // A q8 value set from its own dequantized block reads back unchanged.
  void write_moment(int k, std::size_t begin, std::span<const float> values);

  // One update of every owned parameter from grads (size(), any dtype): t = state().step + 1. If
  // params_out has data, the new params are also written there in its dtype (16-bit by the
  // kernels; fp32 copied from the new master of each piece, while it is in memory).
  cpu_adam::StepResult step(cpu_adam::ConstArrayView grads, float lr, float grad_multiplier,
                            cpu_adam::ArrayView params_out = {});
  // Update number t over the owned elements of layout range [begin, end) only, without touching
  // state().step: the offload engine updates group by group, every group with the same t. grads
  // and params_out are whole local (size()) arrays. Call from one thread at a time.
  cpu_adam::StepResult update_range(std::size_t begin, std::size_t end,
                                    cpu_adam::ConstArrayView grads, std::int64_t t, float lr,
                                    float grad_multiplier, cpu_adam::ArrayView params_out = {});

  // The first value that cannot be a state of training, as "<array> of <tensor> [index i]: <what>"
  // (master, m or v non-finite, v negative, m or v non-zero at Adam step 0), or "" when all are
  // valid. Parallel; for refusing weights and checkpoints before the first step.
  std::string find_invalid(const model::ParameterLayout& layout);

  // Maximal runs of tensors with the same weight-decay setting, in layout order; the
  // GPU-resident mode gives them to the device AdamW as its run table.
  struct Run {
    std::size_t begin, end;
    bool decay;
  };
  const std::vector<Run>& runs() const { return runs_; }

 private:
  // The arrays of local elements [begin, end): master, m and v from element `begin`, the q8 block
  // maxima indexed by block number - block0.
  struct StateSpan {
    std::size_t begin, end;
    char* master;
    char* m;
    char* v;
    float* m_absmax;
    float* v_absmax;
    std::size_t block0;
  };
  // Calls f(StateSpan) over local elements [begin, end): once in memory; chunk by chunk on a
  // drive (read, or reused from a slot; written behind when `write`). One thread at a time on a
  // drive.
  template <class F>
  void visit(std::size_t begin, std::size_t end, bool write, F&& f) const;
  void refuse_whole_arrays(const char* what) const;
  // cpu_adam over one piece (buf's master, moments and grads set), its new parameters into
  // params_out (whole local array, or none) in params_out's dtype.
  cpu_adam::StepResult update_piece(cpu_adam::AdamBuffers& buf, const StateSpan& s, std::int64_t t,
                                    float grad_multiplier, cpu_adam::ArrayView params_out);
  cpu_adam::ArrayView moment_view(pinned::HostBuffer& b);
  // The update's master-weight arguments for span s, whose first element is layout index
  // `layout`.
  void set_master(cpu_adam::AdamBuffers& buf, const StateSpan& s, std::size_t layout) const;
  // The segment holding local element i.
  const Segment& segment_of(std::size_t i) const;
  cpu_adam::StepResult update_q8(std::size_t begin, std::size_t end, cpu_adam::ConstArrayView grads,
                                 std::int64_t t, float lr, float grad_multiplier,
                                 cpu_adam::ArrayView params_out);

  std::size_t n_, layout_n_;
  std::vector<OwnedRange> owned_;
  OptimizerConfig config_;
  cpu_adam::CpuAdam adam_;
  pinned::PinnedBuffer master_;
  pinned::HostBuffer m_, v_, m_absmax_, v_absmax_;
  std::vector<Run> runs_;
  std::vector<Segment> segments_;  // in local order
  std::size_t blocks_ = 0;         // q8 blocks over all segments
  std::unique_ptr<StatePager> pager_;
  cpu_adam::AdamState state_;
};

// The segments of a rank that owns `owned` of `layout`, in local order: each tensor's part in each
// range, its q8 blocks numbered on from the previous segment's (as a HostOptimizer over them
// keeps them). For the plan.
std::vector<SegmentSpan> state_segments(const model::ParameterLayout& layout,
                                        const std::vector<OwnedRange>& owned);
// q8 blocks over those segments.
std::size_t q8_block_count(const model::ParameterLayout& layout,
                           const std::vector<OwnedRange>& owned);

}  // namespace zo::optim
