#include "fiber.h"

#include <cstdint>
#include <cstring>

#ifdef ZO_SIMT_FAST_FIBERS

// zo_simt_switch(void** save_sp, void* load_sp): pushes the callee-saved registers and the
// MXCSR / x87 control words, stores the stack pointer in *save_sp, loads load_sp and pops the
// same frame from there (System V AMD64 ABI: rbx, rbp, r12-r15 survive calls; the control words
// too). A new fiber's stack holds such a frame whose return address is its entry function.
extern "C" void zo_simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl zo_simt_switch
  .type zo_simt_switch, @function
zo_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size zo_simt_switch, .-zo_simt_switch
)");

namespace zo::simt {

void prepare_fiber(FiberContext& c, char* stack, std::size_t bytes, void (*entry)()) {
  // From the 16-byte aligned top down: a zero return address for `entry` (so that its stack
  // pointer at entry is 8 mod 16, as after a call), `entry` itself as the switch's return
  // address, six zeroed registers, and the current control words.
  auto top = reinterpret_cast<std::uintptr_t>(stack + bytes) & ~std::uintptr_t{15};
  auto* frame = reinterpret_cast<std::uint64_t*>(top) - 9;
  std::memset(frame, 0, 9 * sizeof(std::uint64_t));
  std::uint32_t mxcsr = 0;
  std::uint16_t fpcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  std::memcpy(&frame[0], &mxcsr, sizeof mxcsr);
  std::memcpy(reinterpret_cast<char*>(&frame[0]) + 4, &fpcw, sizeof fpcw);
  frame[7] = reinterpret_cast<std::uint64_t>(entry);
  c.sp = frame;
}

void switch_fiber(FiberContext& from, FiberContext& to) {
  zo_simt_switch(&from.sp, to.sp);
}

}  // namespace zo::simt

#else

namespace zo::simt {

void prepare_fiber(FiberContext& c, char* stack, std::size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}

void switch_fiber(FiberContext& from, FiberContext& to) {
  swapcontext(&from.uc, &to.uc);
}

}  // namespace zo::simt

#endif
