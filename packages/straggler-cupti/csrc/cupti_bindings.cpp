// Python bindings of the process-wide CUPTI collector (module _cupti_ext).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "cupti_collector.hpp"

namespace nb = nanobind;
namespace rc = resiliency::cupti;

namespace {

nb::list summaries_to_list(const std::vector<rc::KernelSummary>& summaries) {
  nb::list out;
  for (const rc::KernelSummary& s : summaries) {
    out.append(nb::make_tuple(s.key, s.count, s.min_us, s.max_us, s.median_us, s.mean_us));
  }
  return out;
}

// CUPTI calls can block (a flush waits for CUPTI's worker) and never need Python, so every
// entry point that reaches CUPTI runs without the GIL.
template <typename F>
auto without_gil(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

}  // namespace

NB_MODULE(_cupti_ext, m) {
  m.doc() = "The process-wide CUPTI kernel-activity collector.";

  nb::exception<rc::CuptiUnavailable>(m, "CuptiUnavailableError", PyExc_RuntimeError);
  nb::exception<rc::CollectorStateError>(m, "CollectorStateError", PyExc_RuntimeError);
  // CuptiCallError carries the failed call and code, so it gets a hand-written translator.
  // Deliberately never released: the translator may run until the interpreter exits.
  static nb::handle call_error_type = PyErr_NewException(
      "resiliency.straggler_cupti._cupti_ext.CuptiCallError", PyExc_RuntimeError, nullptr);
  m.attr("CuptiCallError") = call_error_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const rc::CuptiCallError& e) {
      nb::object error = call_error_type(e.what());
      error.attr("call") = e.call();
      error.attr("code") = e.code();
      PyErr_SetObject(call_error_type.ptr(), error.ptr());
    }
  });

  m.def(
      "configure",
      [](std::size_t max_kernels, std::size_t max_samples_per_kernel, bool key_by_shape,
         std::size_t buffer_size, std::size_t buffer_count) {
        rc::CollectorConfig config;
        config.limits = rc::AggregatorLimits{max_kernels, max_samples_per_kernel, key_by_shape};
        config.buffer_size = buffer_size;
        config.buffer_count = buffer_count;
        rc::collector::configure(config);
      },
      nb::arg("max_kernels"), nb::arg("max_samples_per_kernel"), nb::arg("key_by_shape"),
      nb::arg("buffer_size"), nb::arg("buffer_count"));
  m.def("start", [] { without_gil([] { rc::collector::start(); return 0; }); });
  m.def("stop", [] { without_gil([] { rc::collector::stop(); return 0; }); });
  m.def("depth", &rc::collector::depth);
  m.def("read_and_reset", [] {
    return summaries_to_list(without_gil([] { return rc::collector::read_and_reset(); }));
  });
  m.def("dropped_records",
        [] { return without_gil([] { return rc::collector::dropped_records(); }); });
  m.def("counters", [] {
    const rc::CollectorCounters c = rc::collector::counters();
    nb::dict out;
    out["cupti_dropped"] = c.cupti_dropped;
    out["dropped_table_full"] = c.dropped_table_full;
    out["dropped_invalid"] = c.dropped_invalid;
    out["pool_exhausted"] = c.pool_exhausted;
    out["buffers_completed"] = c.buffers_completed;
    out["kernel_records"] = c.kernel_records;
    out["other_records"] = c.other_records;
    out["callback_errors"] = c.callback_errors;
    return out;
  });
  m.def("shutdown", [] { without_gil([] { rc::collector::shutdown(); return 0; }); });
  m.def("cupti_version", &rc::collector::cupti_version);
  m.attr("BACKEND") = rc::collector::backend();
}
