// Parameter streaming (docs/offload.md, "Stream mode"): instead of every 16-bit parameter, the
// device holds the groups each pass reads at both ends (the embeddings and the final group, kept
// resident) and K slots the size of the largest block, through which the blocks pass. A block is
// copied from the host copy into a slot on the H2D stream just before the compute stream needs it
// (prefetched in pass order: ascending in forward, descending in backward), with events so that a
// slot is never overwritten while a kernel still reads the group it held. The model's
// parameter-read protocol (ParameterStore::before_read) says which group is read next.
//
// The window only moves bytes and keeps the events; UploadPipeline decides when the host copy of
// a group is current (Adam has finished it) and so when a fill may read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "device/device.h"
#include "model/layout.h"

namespace zo::offload {

class ParamWindow {
 public:
  // `slots` >= 2. poison: every slot is filled with NaN before it takes a new group (a read the
  // protocol did not announce, or a fill that overtook a kernel, then reaches the losses).
  // forward_only: no backward follows a forward (eval, sample), so the end of one forward
  // prefetches the first blocks of the next.
  ParamWindow(dev::Device& device, dev::Stream& compute, dev::Stream& h2d,
              const model::ParameterLayout& layout, int slots, bool poison,
              bool forward_only = false);
  ParamWindow(const ParamWindow&) = delete;
  ParamWindow& operator=(const ParamWindow&) = delete;

  // Groups 0 and n_layer + 1 stay on the device; the blocks stream.
  static bool resident(const model::ParameterLayout& layout, std::size_t g);
  // Device bytes a window of `slots` allocates for parameters in `esize`-byte elements (without
  // poison's one-slot NaN source).
  static std::size_t device_bytes(const model::ParameterLayout& layout, std::size_t esize,
                                  int slots);

  // The device address of the parameter at layout element `offset`; its group must be resident
  // or held by a slot (throws std::logic_error naming the group otherwise).
  const void* param(std::size_t offset) const;
  // Where resident group g lives (elements in layout order from the group's first).
  void* resident_base(std::size_t g) const;

  bool held(std::size_t g) const;  // a slot holds the current host copy of streamed group g
  // The host copy of streamed group g changed: a slot holding it is stale.
  void invalidate(std::size_t g);
  // The events a copy of group h records around itself.
  struct FillEvents {
    dev::Event &begin, &end;
  };
  // ParameterStore::before_read(g) in one call: release, fill g from `host` unless a slot holds
  // it, acquire, then prefetch the next groups of the pass (ahead) in order while ready(h) says
  // their host copy may be read now (it may prepare it; the first that may not ends the
  // prefetch). Resident groups are the caller's.
  void enter(std::size_t g, const void* host, const std::function<bool(std::size_t)>& ready,
             const std::function<FillEvents(std::size_t)>& events);

  // The compute stream has been given every op that reads the group acquired last: its slot may
  // be refilled once those ops are done.
  void release();
  // Enqueues on the H2D stream a copy of streamed group g from `host` (layout order from element
  // 0; valid until the copy ends) into the least recently used slot that holds none of `keep`,
  // after the compute stream has released that slot. Records `begin` and `end` around the copy.
  void fill(std::size_t g, const void* host, const std::vector<std::size_t>& keep,
            dev::Event& begin, dev::Event& end);
  // The compute stream is about to read group g (resident, or held after fill; after release):
  // it waits for g's fill.
  void acquire(std::size_t g);
  // The next streamed groups after g in the direction of the pass (the last acquire before g
  // says which), at most `count`, nearest first.
  std::vector<std::size_t> ahead(std::size_t g, std::size_t count) const;

  // The copies enqueued since the last call (at most kCopyLog of them; none in a forward-only
  // window), in order, for timings and the trace; their events are valid until the next fill
  // and must be complete to be read.
  struct Copy {
    std::size_t group;
    dev::Event *begin, *end;
  };
  std::vector<Copy> take_copies();
  static constexpr std::size_t kCopyLog = 4096;

 private:
  struct Slot {
    dev::Buffer memory;
    std::size_t group = kNone;  // the group it holds (or is being filled with)
    bool current = false;       // holds the current host copy of `group`
    std::uint64_t last_use = 0;
    std::unique_ptr<dev::Event> filled, released;  // H2D: copy done; compute: reads done
  };
  static constexpr std::size_t kNone = ~std::size_t{0};
  // The group's elements start at an address with the flat buffer's alignment modulo 256 bytes,
  // so a GEMM sees the same alignment (and cuBLASLt picks the same kernel) in either mode.
  std::size_t skew(std::size_t g) const;
  Slot* slot_of(std::size_t g);
  const Slot* slot_of(std::size_t g) const;

  dev::Device& dev_;
  dev::Stream& compute_;
  dev::Stream& h2d_;
  const model::ParameterLayout& layout_;
  const std::size_t esize_;
  dev::Buffer resident_;                 // groups 0 and L + 1
  std::vector<std::size_t> res_offset_;  // per group: its byte offset in resident_ (or kNone)
  std::vector<Slot> slots_;
  dev::Buffer nans_;  // poison: one slot of NaN
  struct Logged {
    std::size_t group;
    std::unique_ptr<dev::Event> begin, end;
  };
  std::vector<Logged> log_;  // events reused from call to call of take_copies
  std::size_t logged_ = 0;
  std::uint64_t uses_ = 0;
  int slot_count_;
  bool forward_only_;
  std::size_t last_ = kNone;  // the group acquired last
  Slot* reading_ = nullptr;   // its slot, until release (null for a resident group)
  // Where the pass goes: up (forward), down (backward), or unknown (after the head in forward:
  // a backward or the next forward follows).
  enum class Phase { kIdle, kAscending, kDescending } phase_ = Phase::kIdle;
};

}  // namespace zo::offload
