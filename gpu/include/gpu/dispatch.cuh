// Runtime DType -> CUDA storage type, for launchers: ZO_DISPATCH_DTYPE(t, T, { body using T }).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>

#include "core/dtype.h"

#define ZO_DISPATCH_DTYPE(dtype, T, ...)                                   \
  do {                                                                     \
    switch (dtype) {                                                       \
      case ::zo::DType::kF32: {                                            \
        using T = float;                                                   \
        __VA_ARGS__;                                                       \
        break;                                                             \
      }                                                                    \
      case ::zo::DType::kF16: {                                            \
        using T = __half;                                                  \
        __VA_ARGS__;                                                       \
        break;                                                             \
      }                                                                    \
      case ::zo::DType::kBF16: {                                           \
        using T = __nv_bfloat16;                                           \
        __VA_ARGS__;                                                       \
        break;                                                             \
      }                                                                    \
      default:                                                             \
        throw std::invalid_argument("unsupported dtype for a GPU kernel"); \
    }                                                                      \
  } while (0)
