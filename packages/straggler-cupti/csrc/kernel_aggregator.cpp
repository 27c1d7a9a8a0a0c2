#include "kernel_aggregator.hpp"

#include <algorithm>
#include <stdexcept>

namespace resiliency::cupti {

namespace {

constexpr std::uint64_t kRngSeed = 0x9E3779B97F4A7C15ULL;

double ns_to_us(double ns) { return ns / 1000.0; }

void append_triple(std::string& out, const std::int32_t (&v)[3]) {
  out += '(';
  out += std::to_string(v[0]);
  out += ',';
  out += std::to_string(v[1]);
  out += ',';
  out += std::to_string(v[2]);
  out += ')';
}

// Median of the kept samples; reorders them (the window is discarded afterwards anyway).
double median_ns(std::vector<std::uint64_t>& samples) {
  const std::size_t n = samples.size();
  const std::size_t mid = n / 2;
  std::nth_element(samples.begin(), samples.begin() + mid, samples.end());
  const double upper = static_cast<double>(samples[mid]);
  if (n % 2 == 1) {
    return upper;
  }
  const double lower =
      static_cast<double>(*std::max_element(samples.begin(), samples.begin() + mid));
  return (lower + upper) / 2.0;
}

}  // namespace

KernelAggregator::KernelAggregator(AggregatorLimits limits)
    : limits_(limits), rng_state_(kRngSeed) {
  if (limits_.max_kernels == 0) {
    throw std::invalid_argument("max_kernels must be at least 1");
  }
  if (limits_.max_samples_per_kernel == 0) {
    throw std::invalid_argument("max_samples_per_kernel must be at least 1");
  }
}

std::string_view KernelAggregator::make_key(const KernelRecord& record) {
  if (!limits_.key_by_shape) {
    return record.name;
  }
  // Rendered like a launch, name<<<grid,block>>>, so a key reads as what was launched.
  key_scratch_.assign(record.name);
  key_scratch_ += "<<<";
  append_triple(key_scratch_, record.grid);
  key_scratch_ += ',';
  append_triple(key_scratch_, record.block);
  key_scratch_ += ">>>";
  return key_scratch_;
}

std::uint64_t KernelAggregator::next_random() {
  // splitmix64: cheap, and deterministic so a window's reservoir is reproducible.
  std::uint64_t z = (rng_state_ += kRngSeed);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void KernelAggregator::add_sample(KernelState& state, std::uint64_t duration_ns) {
  state.count += 1;
  state.sum_ns += duration_ns;
  if (state.count == 1) {
    state.min_ns = duration_ns;
    state.max_ns = duration_ns;
  } else {
    state.min_ns = std::min(state.min_ns, duration_ns);
    state.max_ns = std::max(state.max_ns, duration_ns);
  }
  if (state.samples.size() < limits_.max_samples_per_kernel) {
    state.samples.push_back(duration_ns);
    return;
  }
  // Reservoir sampling (algorithm R): every sample of the window is kept with equal probability.
  const std::uint64_t slot = next_random() % state.count;
  if (slot < state.samples.size()) {
    state.samples[slot] = duration_ns;
  }
}

void KernelAggregator::add(const KernelRecord& record) {
  if (record.start_ns == 0 || record.end_ns == 0 || record.end_ns < record.start_ns) {
    ++dropped_invalid_;
    return;
  }
  const std::uint64_t duration_ns = record.end_ns - record.start_ns;
  const std::string_view key = make_key(record);
  auto it = kernels_.find(key);
  if (it == kernels_.end()) {
    if (kernels_.size() >= limits_.max_kernels) {
      ++dropped_table_full_;
      return;
    }
    it = kernels_.emplace(std::string(key), KernelState{}).first;
  }
  add_sample(it->second, duration_ns);
}

std::vector<KernelSummary> KernelAggregator::read_and_reset() {
  std::vector<KernelSummary> out;
  out.reserve(kernels_.size());
  for (auto& [key, state] : kernels_) {
    KernelSummary summary;
    summary.key = key;
    summary.count = state.count;
    summary.min_us = ns_to_us(static_cast<double>(state.min_ns));
    summary.max_us = ns_to_us(static_cast<double>(state.max_ns));
    summary.mean_us =
        ns_to_us(static_cast<double>(state.sum_ns) / static_cast<double>(state.count));
    summary.median_us = ns_to_us(median_ns(state.samples));
    out.push_back(std::move(summary));
  }
  kernels_.clear();
  return out;
}

}  // namespace resiliency::cupti
