// Per-kernel duration statistics over a window of activity records.
//
// This unit knows nothing about CUPTI: it is fed plain records (a kernel name, start and end
// timestamps, a launch shape), so tests can drive it with synthetic records on a machine
// without a GPU. It is not thread-safe; the CUPTI collector serialises access with a mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace resiliency::cupti {

// One completed kernel launch, as the aggregator needs it.
struct KernelRecord {
  std::string_view name;
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  std::int32_t grid[3] = {1, 1, 1};
  std::int32_t block[3] = {1, 1, 1};
};

// The statistics of one kernel key over the samples since the last read.
struct KernelSummary {
  std::string key;
  std::uint64_t count = 0;
  double min_us = 0.0;
  double max_us = 0.0;
  double median_us = 0.0;
  double mean_us = 0.0;
};

struct AggregatorLimits {
  // Distinct kernel keys kept per window; records of further keys are dropped and counted.
  std::size_t max_kernels = 4096;
  // Durations kept per key for the median. Past it, count/min/max/mean stay exact and the
  // median comes from a uniform reservoir sample of this size.
  std::size_t max_samples_per_kernel = 2048;
  // Key by name and launch shape (grid, block) instead of by name alone: the same kernel
  // launched on differently sized problems has different durations.
  bool key_by_shape = true;
};

class KernelAggregator {
 public:
  // Throws std::invalid_argument when a limit is zero.
  explicit KernelAggregator(AggregatorLimits limits);

  // Adds one record. Records without valid timestamps (zero, or end before start: CUPTI
  // reports those when it had no device memory to time a kernel) are dropped and counted.
  void add(const KernelRecord& record);

  // Returns the statistics of every key seen since the previous call, then starts a new window.
  std::vector<KernelSummary> read_and_reset();

  // Records lost since construction (cumulative, never reset by read_and_reset).
  std::uint64_t dropped() const { return dropped_table_full_ + dropped_invalid_; }
  std::uint64_t dropped_table_full() const { return dropped_table_full_; }
  std::uint64_t dropped_invalid() const { return dropped_invalid_; }
  // Distinct keys in the current window.
  std::size_t kernel_count() const { return kernels_.size(); }
  const AggregatorLimits& limits() const { return limits_; }

 private:
  struct KernelState {
    std::uint64_t count = 0;
    std::uint64_t min_ns = 0;
    std::uint64_t max_ns = 0;
    std::uint64_t sum_ns = 0;
    std::vector<std::uint64_t> samples;
  };

  // Heterogeneous lookup: finding an existing key costs no allocation.
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view key) const noexcept {
      return std::hash<std::string_view>{}(key);
    }
  };

  std::string_view make_key(const KernelRecord& record);
  void add_sample(KernelState& state, std::uint64_t duration_ns);
  std::uint64_t next_random();

  AggregatorLimits limits_;
  std::unordered_map<std::string, KernelState, KeyHash, std::equal_to<>> kernels_;
  std::string key_scratch_;
  std::uint64_t rng_state_;
  std::uint64_t dropped_table_full_ = 0;
  std::uint64_t dropped_invalid_ = 0;
};

}  // namespace resiliency::cupti
