// The process-wide CUPTI kernel collector.
//
// CUPTI's activity buffers and callbacks are global to a process, so the collector is a set of
// free functions over one hidden instance. This header includes no CUPTI header: the bindings
// compile against it both in the real build (cupti_collector.cpp) and in the stub build
// (cupti_collector_stub.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_aggregator.hpp"

namespace resiliency::cupti {

struct CollectorConfig {
  AggregatorLimits limits;
  // Bytes per activity buffer handed to CUPTI, and the most buffers that may exist at once.
  std::size_t buffer_size = std::size_t{1} << 20;
  std::size_t buffer_count = 8;
};

struct CollectorCounters {
  std::uint64_t cupti_dropped = 0;          // records CUPTI reports it could not store
  std::uint64_t dropped_table_full = 0;     // records of a new kernel key past max_kernels
  std::uint64_t dropped_invalid = 0;        // records without valid timestamps
  std::uint64_t pool_exhausted = 0;         // buffer requests refused: the pool was empty
  std::uint64_t buffers_completed = 0;      // buffers CUPTI handed back
  std::uint64_t kernel_records = 0;         // kernel records aggregated
  std::uint64_t other_records = 0;          // records of other activity kinds (another CUPTI user)
  std::uint64_t callback_errors = 0;        // buffers whose records could not be processed
};

// A CUPTI call failed; what() names the call, the code and CUPTI's description.
class CuptiCallError : public std::runtime_error {
 public:
  CuptiCallError(std::string call, int code, const std::string& message)
      : std::runtime_error(message), call_(std::move(call)), code_(code) {}
  const std::string& call() const { return call_; }
  int code() const { return code_; }

 private:
  std::string call_;
  int code_;
};

// This build cannot collect at all (the stub build).
class CuptiUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The collector was used out of order (stop() without start(), configure() while active).
class CollectorStateError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace collector {

// Applies new limits and pool sizes and starts from an empty window with zeroed counters.
// Throws CollectorStateError while collection is active.
void configure(const CollectorConfig& config);
// Enables kernel activity collection on the first (outermost) start.
void start();
// Disables it on the last stop. Throws CollectorStateError without a matching start().
void stop();
int depth();
// Flushes completed CUPTI buffers, then returns and clears the window's statistics.
std::vector<KernelSummary> read_and_reset();
// Total records lost since configure(): CUPTI's count plus the aggregator's.
std::uint64_t dropped_records();
CollectorCounters counters();
// Ends collection at any depth and hands completed buffers back; leaves CUPTI attached.
void shutdown();
// "cupti" or "stub".
const char* backend();
// CUPTI's API version as the loaded library reports it; 0 in the stub build.
std::uint32_t cupti_version();

}  // namespace collector
}  // namespace resiliency::cupti
