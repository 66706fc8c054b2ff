// The SIMT emulator's running block, private to tests/simt: what its scheduler (simt.cpp) and
// its warp syncs, shuffles and collectives (warp_sync.cpp) share.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <source_location>
#include <string>
#include <vector>

#include "fiber.h"
#include "simt.h"

namespace zo::simt {

constexpr int kWarp = 32;

enum class State { kReady, kBlockBarrier, kWarpSync, kDone };

struct Fiber {
  FiberContext context;
  uint3 tid{};
  int linear = 0;
  State state = State::kReady;
  unsigned mask = 0;          // kWarpSync: the lanes that take part
  WarpOp op = nullptr;        // kWarpSync: the warp collective (null: a shuffle)
  int variant = 0;            // its qualifiers
  std::source_location site;  // where the thread waits
  AsyncCopies async;          // cp.async copies in flight
};

struct Block {
  const char* name = "";
  dim3 grid, dim;
  uint3 idx{};
  std::vector<Fiber>* fibers = nullptr;
  FiberContext scheduler;
  void* dynamic_shared = nullptr;
  std::size_t dynamic_shared_bytes = 0;
  const std::function<void()>* body = nullptr;
  // Per thread: what it offers at its current warp sync, and what it offered at the last shuffle
  // that completed (copied on release, so a lane that runs ahead to its next shuffle cannot
  // overwrite a value a later lane of the same round has yet to read) or its result of the last
  // warp collective.
  struct Slot {
    std::array<unsigned char, kWarpOperandBytes> offered{};
    std::array<unsigned char, kWarpResultBytes> published{};
  };
  std::vector<Slot> slots;
  std::vector<int> exited;  // per warp: lanes that have returned
  std::exception_ptr error;
};

// The block the calling OS thread runs, and the thread (fiber) running now.
extern thread_local Block* t_block;
extern thread_local Fiber* t_fiber;

extern std::atomic<std::uint64_t> g_warp_syncs, g_warp_collectives;

std::string where(const std::source_location& s);
std::string thread_name(const Block& b, const Fiber& f);
[[noreturn]] void fail(const Block& b, const std::string& what);

// Back to the scheduler until it makes this thread ready again.
inline void wait(State s, const std::source_location& site, unsigned mask = 0, WarpOp op = nullptr,
                 int variant = 0) {
  Fiber& f = *t_fiber;
  f.state = s;
  f.site = site;
  f.mask = mask;
  f.op = op;
  f.variant = variant;
  switch_fiber(f.context, t_block->scheduler);
}

// warp_sync.cpp: releases the lanes of the warp from warp_base waiting at a complete warp sync
// (shuffle or collective); false when it has none.
bool release_warp(Block& b, int warp_base);

}  // namespace zo::simt
