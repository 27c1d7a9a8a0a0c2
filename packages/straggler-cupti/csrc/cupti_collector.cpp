// CUPTI activity-API collector: buffer callbacks into a bounded pool, records into the aggregator.
#include "cupti_collector.hpp"

#include <cuda.h>
#include <cupti.h>

#include <atomic>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace resiliency::cupti {
namespace {

// CUPTI delivers records in the layout of the loaded library; later versions only append
// fields, so the newest struct this header knows reads name, timestamps and shape correctly.
#if CUDA_VERSION >= 13000
using KernelActivity = CUpti_ActivityKernel10;
#else
using KernelActivity = CUpti_ActivityKernel9;
#endif

constexpr std::align_val_t kBufferAlignment{8};  // CUPTI requires 8-byte aligned buffers

struct State {
  // Serialises start/stop/configure/shutdown: the enable/disable calls follow the depth.
  std::mutex control_mutex;
  int depth = 0;
  bool callbacks_registered = false;  // and kernel activity enabled at least once

  // The buffer pool. Request callbacks come from application threads, completions from
  // CUPTI's worker thread (or the flushing thread), hence its own mutex.
  std::mutex pool_mutex;
  std::vector<std::uint8_t*> free_buffers;
  std::size_t allocated = 0;
  std::size_t buffer_size = CollectorConfig{}.buffer_size;
  std::size_t buffer_count = CollectorConfig{}.buffer_count;
  std::atomic<std::uint64_t> pool_exhausted{0};
  std::atomic<std::uint64_t> buffers_completed{0};
  std::atomic<std::uint64_t> other_records{0};
  std::atomic<std::uint64_t> callback_errors{0};

  // The aggregation window, written by the completion callback and read by read_and_reset.
  std::mutex aggregate_mutex;
  KernelAggregator aggregator{AggregatorLimits{}};
  std::uint64_t cupti_dropped = 0;
  std::uint64_t kernel_records = 0;
};

State& state() {
  // Never destroyed: CUPTI's worker thread may hand back a buffer while the process exits,
  // after static destructors would have run.
  static State* const instance = new State();
  return *instance;
}

std::string describe(CUptiResult result) {
  const char* text = nullptr;
  if (cuptiGetResultString(result, &text) != CUPTI_SUCCESS || text == nullptr) {
    return "unknown CUPTI error";
  }
  return text;
}

void check(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) {
    return;
  }
  throw CuptiCallError(call, static_cast<int>(result),
                       std::string(call) + " failed with CUPTI error " +
                           std::to_string(static_cast<int>(result)) + " (" + describe(result) +
                           ")");
}

void release_buffer(std::uint8_t* buffer, std::size_t size) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.pool_mutex);
  // Buffers of an earlier configuration (another size, or beyond a smaller count) are freed.
  if (size != s.buffer_size || s.allocated > s.buffer_count) {
    ::operator delete[](buffer, kBufferAlignment);
    --s.allocated;
    return;
  }
  s.free_buffers.push_back(buffer);
}

void CUPTIAPI on_buffer_requested(std::uint8_t** buffer, std::size_t* size,
                                  std::size_t* max_records) {
  State& s = state();
  *max_records = 0;
  *buffer = nullptr;
  *size = 0;
  std::lock_guard<std::mutex> lock(s.pool_mutex);
  if (!s.free_buffers.empty()) {
    *buffer = s.free_buffers.back();
    s.free_buffers.pop_back();
  } else if (s.allocated < s.buffer_count) {
    *buffer = static_cast<std::uint8_t*>(
        ::operator new[](s.buffer_size, kBufferAlignment, std::nothrow));
    if (*buffer != nullptr) {
      ++s.allocated;
    }
  }
  if (*buffer == nullptr) {
    // CUPTI drops the records it cannot store and counts them (cupti_dropped).
    s.pool_exhausted.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  *size = s.buffer_size;
}

void CUPTIAPI on_buffer_completed(CUcontext /*context*/, std::uint32_t /*stream_id*/,
                                  std::uint8_t* buffer, std::size_t size,
                                  std::size_t valid_size) {
  State& s = state();
  s.buffers_completed.fetch_add(1, std::memory_order_relaxed);
  // A callback must not throw into CUPTI: failures are counted and reported by counters().
  try {
    thread_local std::vector<KernelRecord> records;
    records.clear();
    std::uint64_t other = 0;
    CUpti_Activity* record = nullptr;
    // Parsed outside the aggregate lock so read_and_reset waits as little as possible.
    while (valid_size > 0 &&
           cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
          record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
        ++other;
        continue;
      }
      const auto* kernel = reinterpret_cast<const KernelActivity*>(record);
      KernelRecord out;
      out.name = kernel->name != nullptr ? std::string_view(kernel->name) : "<unnamed>";
      out.start_ns = kernel->start;
      out.end_ns = kernel->end;
      out.grid[0] = kernel->gridX;
      out.grid[1] = kernel->gridY;
      out.grid[2] = kernel->gridZ;
      out.block[0] = kernel->blockX;
      out.block[1] = kernel->blockY;
      out.block[2] = kernel->blockZ;
      records.push_back(out);
    }
    std::size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) != CUPTI_SUCCESS) {
      dropped = 0;
      s.callback_errors.fetch_add(1, std::memory_order_relaxed);
    }
    s.other_records.fetch_add(other, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(s.aggregate_mutex);
      for (const KernelRecord& r : records) {
        s.aggregator.add(r);
      }
      s.kernel_records += records.size();
      s.cupti_dropped += dropped;
    }
  } catch (...) {
    s.callback_errors.fetch_add(1, std::memory_order_relaxed);
  }
  release_buffer(buffer, size);
}

// Reads CUPTI's dropped-record count into the window; caller holds aggregate_mutex.
void poll_cupti_dropped(State& s) {
  std::size_t dropped = 0;
  check(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped),
        "cuptiActivityGetNumDroppedRecords");
  s.cupti_dropped += dropped;
}

bool callbacks_registered() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.control_mutex);
  return s.callbacks_registered;
}

}  // namespace

namespace collector {

void configure(const CollectorConfig& config) {
  if (config.buffer_size < 1024) {
    throw std::invalid_argument("buffer_size must be at least 1024 bytes");
  }
  if (config.buffer_count == 0) {
    throw std::invalid_argument("buffer_count must be at least 1");
  }
  KernelAggregator fresh(config.limits);  // validates the limits before anything changes
  State& s = state();
  std::lock_guard<std::mutex> control(s.control_mutex);
  if (s.depth > 0) {
    throw CollectorStateError("cannot reconfigure the CUPTI collector while it is collecting");
  }
  {
    std::lock_guard<std::mutex> pool(s.pool_mutex);
    for (std::uint8_t* buffer : s.free_buffers) {
      ::operator delete[](buffer, kBufferAlignment);
      --s.allocated;
    }
    s.free_buffers.clear();
    s.buffer_size = config.buffer_size;
    s.buffer_count = config.buffer_count;
  }
  {
    std::lock_guard<std::mutex> aggregate(s.aggregate_mutex);
    s.aggregator = std::move(fresh);
    s.cupti_dropped = 0;
    s.kernel_records = 0;
  }
  s.pool_exhausted = 0;
  s.buffers_completed = 0;
  s.other_records = 0;
  s.callback_errors = 0;
}

void start() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.control_mutex);
  if (s.depth == 0) {
    // Registered again on every outermost start: another CUPTI client (torch.profiler, say)
    // may have installed its own callbacks since our last session.
    check(cuptiActivityRegisterCallbacks(on_buffer_requested, on_buffer_completed),
          "cuptiActivityRegisterCallbacks");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
          "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)");
    // Flushing and polling only make sense (and only succeed) once collection has worked.
    s.callbacks_registered = true;
  }
  ++s.depth;
}

void stop() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.control_mutex);
  if (s.depth == 0) {
    throw CollectorStateError("stop() called without a matching start()");
  }
  if (s.depth == 1) {
    check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
          "cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)");
  }
  --s.depth;
}

int depth() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.control_mutex);
  return s.depth;
}

std::vector<KernelSummary> read_and_reset() {
  if (!callbacks_registered()) {
    return {};
  }
  // Flag 0: only buffers whose records are all complete come back, so no record arrives
  // with the zero timestamps of a kernel still running.
  check(cuptiActivityFlushAll(0), "cuptiActivityFlushAll");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.aggregate_mutex);
  poll_cupti_dropped(s);
  return s.aggregator.read_and_reset();
}

std::uint64_t dropped_records() {
  State& s = state();
  const bool registered = callbacks_registered();
  std::lock_guard<std::mutex> lock(s.aggregate_mutex);
  if (registered) {
    poll_cupti_dropped(s);
  }
  return s.cupti_dropped + s.aggregator.dropped();
}

CollectorCounters counters() {
  State& s = state();
  CollectorCounters out;
  {
    std::lock_guard<std::mutex> lock(s.aggregate_mutex);
    out.cupti_dropped = s.cupti_dropped;
    out.dropped_table_full = s.aggregator.dropped_table_full();
    out.dropped_invalid = s.aggregator.dropped_invalid();
    out.kernel_records = s.kernel_records;
  }
  out.pool_exhausted = s.pool_exhausted.load();
  out.buffers_completed = s.buffers_completed.load();
  out.other_records = s.other_records.load();
  out.callback_errors = s.callback_errors.load();
  return out;
}

void shutdown() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.control_mutex);
  if (s.depth > 0) {
    s.depth = 0;
    check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
          "cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)");
  }
  // No cuptiFinalize: it would detach CUPTI from every other user in the process. Only the
  // kind enabled here is disabled; completed buffers come back to the pool.
  if (s.callbacks_registered) {
    check(cuptiActivityFlushAll(0), "cuptiActivityFlushAll");
  }
}

const char* backend() { return "cupti"; }

std::uint32_t cupti_version() {
  std::uint32_t version = 0;
  check(cuptiGetVersion(&version), "cuptiGetVersion");
  return version;
}

}  // namespace collector
}  // namespace resiliency::cupti
