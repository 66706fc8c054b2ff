// Cooperative fibers for the SIMT emulator (simt.cpp): a stack and a saved context each, switched
// explicitly. On x86-64 the switch saves only what the calling convention says survives a call
// (six registers, the SSE and x87 control words), about a hundred times cheaper than glibc's
// swapcontext, which also makes a system call for the signal mask; elsewhere, and under
// AddressSanitizer (which follows stacks through ucontext), it is ucontext.
#pragma once

#include <cstddef>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define ZO_SIMT_FAST_FIBERS 1
#else
#include <ucontext.h>
#endif

namespace zo::simt {

struct FiberContext {
#ifdef ZO_SIMT_FAST_FIBERS
  void* sp = nullptr;  // the saved registers sit on the fiber's stack, below this
#else
  ucontext_t uc{};
#endif
};

// Makes `c` start `entry` on `stack` (`bytes` long) when first switched to. `entry` must never
// return: it ends by switching away for good.
void prepare_fiber(FiberContext& c, char* stack, std::size_t bytes, void (*entry)());

// Saves the running context into `from` and resumes `to`; returns when something switches back
// to `from`.
void switch_fiber(FiberContext& from, FiberContext& to);

}  // namespace zo::simt
