// The op cases of the training step's tail (op_cases_step.cpp), listed in op_cases_table.cpp:
// the gradient norm and Inf/NaN flag, casts, AdamW with its run table and its device-side gate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "op_cases.h"

namespace zo::test::step_cases {

void sum_squares(OpRun& r, std::size_t n);
void nonfinite_flag(OpRun& r);
void cast_from(OpRun& r, zo::DType src_t);
// With `runs`, weight decay by run table; without, every element decays.
void adamw(OpRun& r, const std::vector<std::uint64_t>& runs);
void step_gate(OpRun& r);
void adamw_gated(OpRun& r);

}  // namespace zo::test::step_cases
