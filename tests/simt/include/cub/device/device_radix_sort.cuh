// cub::DeviceRadixSort::SortPairs for the SIMT emulator (tests/simt): the same contract on host
// memory (a stable sort of (key, value) pairs by the key bits [begin_bit, end_bit), ascending,
// signed keys in numeric order), so gpu/src/embedding.cu compiles and runs unchanged.
#pragma once

#include <cuda_runtime_api.h>

#include "streams.h"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  template <typename Key, typename Value, typename NumItems>
  static cudaError_t SortPairs(void* temp, std::size_t& temp_bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out,
                               NumItems num_items, int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                               cudaStream_t stream = 0) {
    static_assert(std::is_integral_v<Key>, "the emulated sort handles integer keys");
    if (temp == nullptr) {  // size query, as with cub
      temp_bytes = 1;
      return cudaSuccess;
    }
    if (begin_bit != 0 || end_bit != static_cast<int>(sizeof(Key) * 8)) {
      return cudaErrorInvalidValue;  // partial key bits are not emulated
    }
    const auto n = static_cast<std::size_t>(num_items);
    // In stream order, like every other piece of device work (streams.h).
    zo::simt::enqueue(stream, [=] {
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return keys_in[a] < keys_in[b]; });
      std::vector<Key> keys(n);
      std::vector<Value> values(n);
      for (std::size_t i = 0; i < n; ++i) {
        keys[i] = keys_in[order[i]];
        values[i] = values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), keys_out);
      std::copy(values.begin(), values.end(), values_out);
    });
    return cudaSuccess;
  }
};

}  // namespace cub
