// The SIMT emulator's warp syncs (tests/simt/simt.h): shuffles and the warp-wide collectives of
// warp_matrix.h, each a meeting of a warp's lanes at one call site that the scheduler (simt.cpp)
// completes once all have arrived.
#include <cstring>
#include <string>

#include "block.h"
#include "simt.h"

namespace zo::simt {
namespace {

bool same_site(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

// The warp collective that the 32 lanes from warp_base, all arrived, wait at: one call for the
// warp.
void run_collective(Block& b, int warp_base, const Fiber& first) {
  const unsigned char* in[kWarp];
  unsigned char* out[kWarp];
  for (int lane = 0; lane < kWarp; ++lane) {
    in[lane] = b.slots[warp_base + lane].offered.data();
    out[lane] = b.slots[warp_base + lane].published.data();
  }
  ++g_warp_collectives;
  try {
    first.op(in, out, first.variant);
  } catch (const SimtError& e) {
    fail(b, "warp " + std::to_string(warp_base / kWarp) + " at " + where(first.site) + ": " +
                e.what());
  }
}

// Checks the lanes of `mask` (a lane that has exited or lies past the block is an error), offers
// `bytes` of `in` and waits until the warp sync completes.
void arrive(const char* what, unsigned mask, const void* in, std::size_t bytes,
            const std::source_location& site, WarpOp op = nullptr, int variant = 0) {
  Block& b = *t_block;
  Fiber& f = *t_fiber;
  const int lane = f.linear % kWarp;
  const int warp_base = f.linear - lane;
  const int n = static_cast<int>(b.fibers->size());
  if ((mask >> lane & 1u) == 0) {
    fail(b, thread_name(b, f) + " calls a " + what + " at " + where(site) +
                " with a mask that leaves out its own lane " + std::to_string(lane));
  }
  const bool whole_warp = warp_base + kWarp <= n && b.exited[warp_base / kWarp] == 0;
  for (int l = 0; l < kWarp && !whole_warp; ++l) {
    if ((mask >> l & 1u) &&
        (warp_base + l >= n || (*b.fibers)[warp_base + l].state == State::kDone)) {
      fail(b, std::string(what) + " at " + where(site) + " by " + thread_name(b, f) +
                  ": its mask names lane " + std::to_string(l) +
                  ", which has exited or does not exist in this block");
    }
  }
  std::memcpy(b.slots[f.linear].offered.data(), in, bytes);
  wait(State::kWarpSync, site, mask, op, variant);
}

}  // namespace

bool release_warp(Block& b, int warp_base) {
  std::vector<Fiber>& fibers = *b.fibers;
  const int n = static_cast<int>(fibers.size());
  Fiber* first = nullptr;
  for (int i = warp_base; i < std::min(n, warp_base + kWarp); ++i) {
    if (fibers[i].state == State::kWarpSync) {
      first = &fibers[i];
      break;
    }
  }
  if (first == nullptr) return false;
  const unsigned mask = first->mask;
  bool complete = true;
  for (int lane = 0; lane < kWarp; ++lane) {
    if ((mask >> lane & 1u) == 0) continue;
    const int i = warp_base + lane;
    // (lanes past the block and exited lanes were refused when the first lane arrived)
    if (i >= n || fibers[i].state == State::kDone) {
      fail(b, "shuffle mask at " + where(first->site) + " names lane " + std::to_string(lane) +
                  " of warp " + std::to_string(warp_base / kWarp) +
                  ", which has exited or does not exist");
    }
    if (fibers[i].state != State::kWarpSync) {
      complete = false;
      continue;
    }
    if (fibers[i].mask != mask || !same_site(fibers[i].site, first->site) ||
        fibers[i].op != first->op || fibers[i].variant != first->variant) {
      fail(b, "lanes of warp " + std::to_string(warp_base / kWarp) + " meet at different warp " +
                  "syncs: " + where(first->site) + " (mask " + std::to_string(mask) + ") and " +
                  where(fibers[i].site) + " (mask " + std::to_string(fibers[i].mask) + ")");
    }
  }
  if (!complete) return false;
  if (first->op != nullptr) {
    run_collective(b, warp_base, *first);
  } else {
    for (int lane = 0; lane < kWarp; ++lane) {
      if ((mask >> lane & 1u) == 0) continue;
      std::memcpy(b.slots[warp_base + lane].published.data(),
                  b.slots[warp_base + lane].offered.data(), kWarpResultBytes);
    }
  }
  for (int lane = 0; lane < kWarp; ++lane) {
    if ((mask >> lane & 1u) == 0) continue;
    fibers[warp_base + lane].state = State::kReady;
  }
  ++g_warp_syncs;
  return true;
}

int lane_id() {
  return t_fiber->linear % kWarp;
}

void shuffle_bytes(unsigned mask, const void* in, void* out, std::size_t bytes, int src_lane,
                   const std::source_location& site) {
  Block& b = *t_block;
  Fiber& f = *t_fiber;
  if ((mask >> src_lane & 1u) == 0 && (mask >> lane_id() & 1u) != 0) {
    fail(b, thread_name(b, f) + " reads lane " + std::to_string(src_lane) + " at " + where(site) +
                ", which is not in the mask (undefined on the hardware)");
  }
  arrive("shuffle", mask, in, bytes, site);
  // Every lane released by that sync runs before the scheduler completes another one.
  const int warp_base = f.linear - f.linear % kWarp;
  std::memcpy(out, b.slots[warp_base + src_lane].published.data(), bytes);
}

void warp_collective(WarpOp op, int variant, const void* in, std::size_t in_bytes, void* out,
                     std::size_t out_bytes, const std::source_location& site) {
  if (t_fiber == nullptr) throw SimtError("SIMT emulator: a warp collective outside a kernel");
  arrive("warp-wide instruction", 0xffffffffu, in, in_bytes, site, op, variant);
  std::memcpy(out, t_block->slots[t_fiber->linear].published.data(), out_bytes);
}

}  // namespace zo::simt
