// The Python module gradsync._torch_backend: the process group class the package's backend
// creator (gradsync/torch.py) builds once the group's ranks have agreed on their job.
#include "client/torch/process_group.h"
#include "client/torch/shared_memory_allocator.h"

#include <gradsync/gradsync.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace gradsync::torch_backend {
namespace {

template <size_t N>
void copy_field(char (&field)[N], const std::string& value, const char* what) {
  TORCH_CHECK(value.size() < N, "gradsync: ", what, " '", value, "' is longer than ", N - 1,
              " bytes");
  std::memset(field, 0, N);
  std::memcpy(field, value.data(), value.size());
}

c10::intrusive_ptr<ProcessGroupGradsync> create(int rank, int size, int local_rank, int local_size,
                                                const std::string& job, const std::string& socket,
                                                const std::string& nodes, int node_rank,
                                                std::vector<std::string> member_addresses,
                                                const std::string& parent_job,
                                                const std::vector<int32_t>& parent_ranks,
                                                std::chrono::milliseconds timeout) {
  // The rest (the inter-node algorithm, the wire codec) as the environment says.
  gradsync_options options{};
  TORCH_CHECK(gradsync_options_from_env(&options) == GRADSYNC_OK,
              "gradsync: ", gradsync_last_error(nullptr));
  gradsync_job_settings settings{};
  settings.struct_bytes = sizeof(settings);
  TORCH_CHECK(gradsync_job_settings_from_env(&settings) == GRADSYNC_OK,
              "gradsync: ", gradsync_last_error(nullptr));
  options.rank = rank;
  options.world_size = size;
  options.local_rank = local_rank;
  options.local_world_size = local_size;
  copy_field(options.job, job, "job name");
  if (!socket.empty()) copy_field(options.socket_path, socket, "socket path");
  copy_field(options.nodes, nodes, "node list");
  options.node_rank = node_rank;
  copy_field(settings.parent_job, parent_job, "parent job name");
  TORCH_CHECK(
      parent_job.empty() ? parent_ranks.empty() : parent_ranks.size() == static_cast<size_t>(size),
      "gradsync: ", parent_ranks.size(), " ranks in the parent job for a group of ", size);
  settings.parent_ranks = parent_ranks.empty() ? nullptr : parent_ranks.data();
  options.timeout_ms =
      static_cast<int32_t>(std::min<int64_t>(timeout.count(), std::numeric_limits<int32_t>::max()));
  GroupLayout layout{std::move(member_addresses)};
  TORCH_CHECK(layout.member_addresses.size() == static_cast<size_t>(size),
              "gradsync: the nodes of ", layout.member_addresses.size(), " ranks for a group of ",
              size);
  try {
    return c10::make_intrusive<ProcessGroupGradsync>(options, settings, std::move(layout), timeout);
  } catch (const gradsync::Error& error) {
    TORCH_CHECK(false, "gradsync: cannot join job '", job, "' as rank ", rank, " of ", size, ": ",
                error.what());
  }
}

}  // namespace
}  // namespace gradsync::torch_backend

PYBIND11_MODULE(_torch_backend, module) {
  namespace py = pybind11;
  using gradsync::torch_backend::ProcessGroupGradsync;
  const py::object base = py::module::import("torch.distributed").attr("ProcessGroup");
  py::class_<ProcessGroupGradsync, c10::intrusive_ptr<ProcessGroupGradsync>>(
      module, "ProcessGroupGradsync", base)
      .def(py::init(&gradsync::torch_backend::create), py::arg("rank"), py::arg("size"),
           py::arg("local_rank"), py::arg("local_size"), py::arg("job"), py::arg("socket"),
           py::arg("nodes"), py::arg("node_rank"), py::arg("member_addresses"),
           py::arg("parent_job"), py::arg("parent_ranks"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property("priority", &ProcessGroupGradsync::priority,
                    &ProcessGroupGradsync::set_priority,
                    "the priority of the collectives called from now on (higher first)")
      .def("shutdown", &ProcessGroupGradsync::shutdown, py::call_guard<py::gil_scoped_release>(),
           "runs what is queued to its end and stops the group's worker; later calls fail")
      .def_property_readonly("staged_bytes", &ProcessGroupGradsync::staged_bytes,
                             "bytes of staging memory this group's calls were copied through");
  using gradsync::torch_backend::SharedMemoryAllocator;
  module.def(
      "use_shared_memory",
      [](size_t min_bytes) { SharedMemoryAllocator::instance().serve_from(min_bytes); },
      py::arg("min_bytes"),
      "CPU tensors of at least min_bytes bytes allocated from now on live in gradsync's shared "
      "memory (0: none)");
  module.def("in_shared_memory", &SharedMemoryAllocator::holds, py::arg("tensor"),
             "whether the tensor lies in gradsync's shared memory");
  module.def(
      "shared_memory_heap",
      [] { return reinterpret_cast<uintptr_t>(SharedMemoryAllocator::instance().heap().get()); },
      "the address of the gradsync_heap the shared memory tensors come from");
}
