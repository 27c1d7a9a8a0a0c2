// Python bindings of the CUPTI-free aggregation core (module _aggregation_ext).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <array>
#include <string>

#include "kernel_aggregator.hpp"

namespace nb = nanobind;
using resiliency::cupti::AggregatorLimits;
using resiliency::cupti::KernelAggregator;
using resiliency::cupti::KernelRecord;
using resiliency::cupti::KernelSummary;

namespace {

using Shape = std::tuple<std::int32_t, std::int32_t, std::int32_t>;

nb::list summaries_to_list(const std::vector<KernelSummary>& summaries) {
  nb::list out;
  for (const KernelSummary& s : summaries) {
    out.append(nb::make_tuple(s.key, s.count, s.min_us, s.max_us, s.median_us, s.mean_us));
  }
  return out;
}

}  // namespace

NB_MODULE(_aggregation_ext, m) {
  m.doc() = "Per-kernel duration statistics over synthetic or CUPTI activity records.";

  nb::class_<KernelAggregator>(m, "KernelAggregator")
      .def(
          "__init__",
          [](KernelAggregator* self, std::size_t max_kernels, std::size_t max_samples_per_kernel,
             bool key_by_shape) {
            new (self) KernelAggregator(
                AggregatorLimits{max_kernels, max_samples_per_kernel, key_by_shape});
          },
          nb::arg("max_kernels"), nb::arg("max_samples_per_kernel"), nb::arg("key_by_shape"))
      .def(
          "add",
          [](KernelAggregator& self, const std::string& name, std::uint64_t start_ns,
             std::uint64_t end_ns, Shape grid, Shape block) {
            KernelRecord record;
            record.name = name;
            record.start_ns = start_ns;
            record.end_ns = end_ns;
            record.grid[0] = std::get<0>(grid);
            record.grid[1] = std::get<1>(grid);
            record.grid[2] = std::get<2>(grid);
            record.block[0] = std::get<0>(block);
            record.block[1] = std::get<1>(block);
            record.block[2] = std::get<2>(block);
            self.add(record);
          },
          nb::arg("name"), nb::arg("start_ns"), nb::arg("end_ns"), nb::arg("grid"),
          nb::arg("block"))
      .def("read_and_reset",
           [](KernelAggregator& self) { return summaries_to_list(self.read_and_reset()); })
      .def_prop_ro("dropped", &KernelAggregator::dropped)
      .def_prop_ro("dropped_table_full", &KernelAggregator::dropped_table_full)
      .def_prop_ro("dropped_invalid", &KernelAggregator::dropped_invalid)
      .def_prop_ro("kernel_count", &KernelAggregator::kernel_count);
}
