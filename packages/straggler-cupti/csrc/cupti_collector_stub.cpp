// The collector of a stub build (RESILIENCY_CUPTI_STUB=ON): no CUPTI, start() refuses clearly.
#include <mutex>

#include "cupti_collector.hpp"

namespace resiliency::cupti {
namespace {

struct StubState {
  std::mutex mutex;
  KernelAggregator aggregator{AggregatorLimits{}};
};

StubState& state() {
  static StubState* const instance = new StubState();
  return *instance;
}

}  // namespace

namespace collector {

void configure(const CollectorConfig& config) {
  KernelAggregator fresh(config.limits);
  StubState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.aggregator = std::move(fresh);
}

void start() {
  throw CuptiUnavailable(
      "this resiliency-straggler-cupti was built as a stub (RESILIENCY_CUPTI_STUB=ON) and cannot "
      "time kernels. Reinstall it on a machine with the CUDA toolkit (or NVIDIA's CUPTI wheels, "
      "see docs/straggler_cupti.md) without RESILIENCY_CUPTI_STUB.");
}

void stop() { throw CollectorStateError("stop() called without a matching start()"); }

int depth() { return 0; }

std::vector<KernelSummary> read_and_reset() { return {}; }

std::uint64_t dropped_records() { return 0; }

CollectorCounters counters() { return {}; }

void shutdown() {}

const char* backend() { return "stub"; }

std::uint32_t cupti_version() { return 0; }

}  // namespace collector
}  // namespace resiliency::cupti
